"""A bare llama-server binary (no ``build.json`` beside it) is asked what it is.

The unit half holds the pure pieces: the backend read from ``--list-devices`` /
``--version`` output, the record made from a binary's own ``--help``, and what the planner
does with and without those capabilities on a card whose config asks for fork cache types.
The real half copies our CPU build somewhere with no ``build.json``, runs a pytest session
on it, and checks the card plans pass and the run record names the binary by its hash.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from checkout import REPO_ROOT

from harness import modelgen
from harness.builds.capabilities import bare_binary_info, bare_binary_key, parse_capabilities
from harness.builds.under_test import BuildUnderTest, resolve_named_build, rpc_server_beside
from harness.errors import ConfigError
from harness.facts.build import Backend, Capabilities
from harness.facts.gpu import GpuInfo
from harness.files import sha256_file
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.probes.devices import infer_backend, parse_device_list
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_fork_kv_types, load_gpu_configs

pytest_plugins = ["pytester"]

DATA = Path(__file__).parent / "data"
HELP = (DATA / "help" / "llama-server-11434-cpu.txt").read_text()
#: What our CPU build prints (captured): ``--list-devices`` on stdout, ``--version`` on
#: stderr.
CPU_LIST = "Available devices:\n  (none)\n"
CPU_VERSION = "version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0 for Linux x86_64"
#: ggml-cuda.cu ``ggml_cuda_init`` on a machine without a GPU: the corpus log's line.
CUDA_NO_GPU = next(line for line in (DATA / "logs" / "cuda" / "init-failed.log")
                   .read_text().splitlines() if "ggml_cuda_init" in line)
ROCM_FOUND = next(line for line in (DATA / "logs" / "rocm" / "used.log")
                  .read_text().splitlines() if "ggml_cuda_init" in line)
H200_LIST = "Available devices:\n  CUDA0: NVIDIA H200 (143771 MiB, 142998 MiB free)\n"


# --- the backend, from what the binary prints (pure) -----------------------------------


@pytest.mark.parametrize(("listing", "stderr", "backend"), [
    pytest.param(CPU_LIST, CPU_VERSION, Backend.CPU, id="cpu-build-says-nothing"),
    pytest.param(H200_LIST, "", Backend.CUDA, id="cuda-device-listed"),
    pytest.param(CPU_LIST, CUDA_NO_GPU, Backend.CUDA, id="cuda-build-without-gpu"),
    pytest.param(CPU_LIST, ROCM_FOUND, Backend.ROCM, id="rocm-init-line"),
    pytest.param("Available devices:\n  Vulkan0: AMD Radeon RX 7900 XTX (RADV NAVI31) "
                 "(24560 MiB, 24304 MiB free)\n", "", Backend.VULKAN, id="vulkan-device"),
    pytest.param(CPU_LIST, "ggml_vulkan: Found 1 Vulkan devices:", Backend.VULKAN,
                 id="vulkan-init-line"),
])
def test_the_backend_is_read_from_devices_then_init_lines(listing: str, stderr: str,
                                                          backend: Backend) -> None:
    assert infer_backend(parse_device_list(listing), listing, stderr) is backend


def test_a_listed_device_outranks_an_init_line() -> None:
    # A ROCm build's device list is what it will run on, whatever else it printed.
    listing = "Available devices:\n  ROCm0: AMD Instinct MI300X (196592 MiB, 196282 MiB free)\n"
    assert infer_backend(parse_device_list(listing), CUDA_NO_GPU) is Backend.ROCM


def test_a_listed_device_gives_its_gpu_a_backend_the_harness_builds_or_none() -> None:
    (h200,) = parse_device_list(H200_LIST)
    assert h200.gpu_info() == GpuInfo("NVIDIA H200", 143771, backend=Backend.CUDA)
    assert h200.gpu_info().backend is Backend.CUDA
    # A ggml backend no Backend names (Metal, SYCL) is listed, but its GPU gets none.
    (metal,) = parse_device_list("Available devices:\n  MTL0: Apple M2 (10922 MiB, "
                                 "10922 MiB free)\n")
    assert (metal.backend, metal.gpu_info().backend) == (None, None)


def test_a_bare_binary_record_carries_its_help_and_a_content_key() -> None:
    sha = "ab" * 32
    info = bare_binary_info(binary="/opt/fork/llama-server", sha256=sha, backend=Backend.CUDA,
                            version=CPU_VERSION, help_text=HELP)
    assert info.key == bare_binary_key(Backend.CUDA, sha) == f"cuda-binary-{sha[:16]}"
    assert info.backend is Backend.CUDA
    assert info.capabilities == parse_capabilities(HELP)
    assert sha in info.source_origin
    assert "/opt/fork/llama-server" in info.source_origin
    assert info.version.startswith("version: 0.6.0-dev")
    # A different file is a different build; the same file anywhere is the same one.
    assert bare_binary_key(Backend.CUDA, "cd" * 32) != info.key
    assert info.rpc_server is None


#: The captured help without its ``--rpc`` option: a build without the RPC client.
HELP_WITHOUT_RPC = "\n".join(line for line in HELP.splitlines()
                             if not line.startswith("--rpc "))


@pytest.mark.parametrize(("help_text", "recorded"), [
    pytest.param(HELP, True, id="help-lists-rpc"),
    pytest.param(HELP_WITHOUT_RPC, False, id="no-rpc-client"),
])
def test_a_bare_binary_records_the_rpc_server_beside_it_when_it_takes_rpc(
        help_text: str, recorded: bool) -> None:
    assert "--rpc " in HELP
    info = bare_binary_info(binary="/work/bin/llama-server", sha256="ab" * 32,
                            backend=Backend.CUDA, version="", help_text=help_text,
                            rpc_server="/work/bin/ggml-rpc-server")
    assert info.rpc_server == ("/work/bin/ggml-rpc-server" if recorded else None)
    assert info.has_rpc is recorded


# --- what the planner does with the capabilities (pure) --------------------------------


def _card_plan(capabilities: Capabilities):  # type: ignore[no-untyped-def]
    path = modelgen.ensure_fixtures().model("mtp")
    config = next(c for c in load_gpu_configs() if c.name == "h200")
    request = PlanRequest(model_path=path, model=read_model_facts(path),
                          gpu=GpuInfo("NVIDIA H200", config.vram_mib),
                          configs=load_gpu_configs(), fork_kv_types=load_fork_kv_types(),
                          capabilities=capabilities, per_call={"ctx_size": 512},
                          explicit_spec_type="none")
    return plan_launch(request)


def test_without_capabilities_the_card_forwards_fork_types_a_stock_server_refuses() -> None:
    accepted = parse_capabilities(HELP).cache_types_k
    blind = _card_plan(Capabilities())
    # The card asks for a fork type; with nothing read from the binary it goes out as is.
    assert blind.spec.cache_type_k not in accepted
    assert blind.spec.cache_type_v not in parse_capabilities(HELP).cache_types_v
    told = _card_plan(parse_capabilities(HELP))
    assert told.spec.cache_type_k in accepted
    assert told.spec.cache_type_v in parse_capabilities(HELP).cache_types_v
    # The call's 512 over the card's 16 slots is padded too (16 x 256 = 4096 cells).
    assert {w.code for w in told.warnings} == {"cache-type-fallback", "ctx-padded"}


# --- probing a real file -------------------------------------------------------------


def _script(path: Path, body: str) -> Path:
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_a_binary_whose_help_fails_is_refused_naming_it_and_the_fix(tmp_path: Path) -> None:
    broken = _script(tmp_path / "llama-server",
                     "echo 'error while loading shared libraries: libcublas.so.13' >&2\nexit 127\n")
    with pytest.raises(ConfigError) as caught:
        resolve_named_build(str(broken), tmp_path / "cache", option="--harness-server-bin")
    message = str(caught.value)
    assert f"--harness-server-bin {broken}" in message
    assert "exited 127" in message
    assert "libcublas.so.13" in message
    assert f"ldd {broken}" in message
    assert "build.json" in message


def test_a_help_without_llama_server_options_gives_unknown_capabilities(
        tmp_path: Path) -> None:
    other = _script(tmp_path / "server", "echo 'usage: server [-h]'\n")
    build = resolve_named_build(str(other), tmp_path / "cache")
    assert build.info is not None
    assert build.info.capabilities.cache_types_k == ()
    assert build.backend is Backend.CPU


def test_a_fake_cuda_binary_is_probed_as_cuda_with_its_help(tmp_path: Path) -> None:
    # A stand-in that answers like a CUDA build on a machine without a GPU.
    (tmp_path / "help.txt").write_text(HELP)
    fake = _script(tmp_path / "llama-server", f"""case "$1" in
  --help) cat {tmp_path / "help.txt"} ;;
  --version) echo '{CPU_VERSION.splitlines()[0]}' >&2 ;;
  --list-devices) echo '{CUDA_NO_GPU}' >&2; printf 'Available devices:\\n  (none)\\n' ;;
esac
""")
    build = resolve_named_build(str(fake), tmp_path / "cache")
    assert build.probed
    assert build.info is not None
    assert build.backend is Backend.CUDA
    assert build.key == f"cuda-binary-{sha256_file(fake)[:16]}"
    assert build.info.capabilities.cache_types_k == parse_capabilities(HELP).cache_types_k


def _fake_server(folder: Path, help_text: str) -> Path:
    """A stand-in llama-server in ``folder`` that prints ``help_text`` for ``--help``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "help.txt").write_text(help_text)
    return _script(folder / "llama-server", f"""case "$1" in
  --help) cat {folder / "help.txt"} ;;
  --list-devices) printf 'Available devices:\\n  (none)\\n' ;;
esac
""")


@pytest.mark.parametrize(("beside", "executable", "help_text", "found"), [
    pytest.param("ggml-rpc-server", True, HELP, "ggml-rpc-server", id="ggml-rpc-server"),
    pytest.param("rpc-server", True, HELP, "rpc-server", id="older-name"),
    pytest.param(None, True, HELP, None, id="none-beside"),
    pytest.param("ggml-rpc-server", False, HELP, None, id="not-executable"),
    pytest.param("ggml-rpc-server", True, HELP_WITHOUT_RPC, None, id="no-rpc-client"),
])
def test_a_probed_binary_takes_the_rpc_server_beside_it(
        tmp_path: Path, beside: str | None, executable: bool, help_text: str,
        found: str | None) -> None:
    fake = _fake_server(tmp_path / "bin", help_text)
    if beside is not None:
        server = tmp_path / "bin" / beside
        if executable:
            _script(server, "exit 0\n")
        else:
            server.write_text("#!/bin/sh\n")
    build = resolve_named_build(str(fake), tmp_path / "cache")
    assert build.probed
    assert build.info is not None
    expected = str(tmp_path / "bin" / found) if found else None
    assert build.info.rpc_server == expected
    assert build.info.has_rpc is (found is not None)


def test_the_newer_rpc_server_name_is_taken_before_the_older(tmp_path: Path) -> None:
    fake = _fake_server(tmp_path / "bin", HELP)
    for name in ("rpc-server", "ggml-rpc-server"):
        _script(tmp_path / "bin" / name, "exit 0\n")
    assert rpc_server_beside(fake) == tmp_path / "bin" / "ggml-rpc-server"


@pytest.mark.server
def test_a_session_on_a_bare_copy_of_the_cpu_build_passes_the_card_plans(
        tmp_path: Path, harness_build: BuildUnderTest) -> None:
    bare = tmp_path / "carried" / "llama-server"
    bare.parent.mkdir()
    shutil.copy2(harness_build.binary, bare)
    assert not (bare.parent / "build.json").exists()
    assert not (bare.parent.parent / "build.json").exists()
    run_json = tmp_path / "run.json"
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "HARNESS_BUILD", "HARNESS_SERVER_BIN",
                                   "HARNESS_RUN_", "HARNESS_REQUIRE_GPU"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
         f"--harness-build={bare}", f"--harness-run-record={run_json}",
         "suites/test_plan_forwarding.py", "-k", "card"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=900, check=False)
    tail = done.stdout[-4000:] + done.stderr[-2000:]
    assert done.returncode == 0, tail
    assert " passed" in done.stdout, tail
    assert " failed" not in done.stdout, tail
    build = json.loads(run_json.read_text())["build"]
    assert build["build_key"] == f"cpu-binary-{sha256_file(bare)[:16]}"
    assert build["backend"] == "cpu"


SERVER_TESTS = """
def test_one(llama_server_binary):
    assert llama_server_binary.exists()

def test_two(llama_server_binary):
    assert llama_server_binary.exists()

def test_three(llama_server_binary):
    assert llama_server_binary.exists()
"""


@pytest.mark.parametrize("option", ["--harness-server-bin", "--harness-build"])
def test_a_missing_named_build_is_one_usage_error_at_session_start(
        pytester: pytest.Pytester, tmp_path: Path, option: str) -> None:
    pytester.makepyfile(SERVER_TESTS)
    missing = tmp_path / "missing" / "llama-server"
    result = pytester.runpytest_subprocess(f"{option}={missing}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    # Named once, with the option, before any test ran (not one error per test; pytest
    # prints an exit's message on both streams).
    assert result.stdout.str().count(str(missing)) == 1, output
    assert "no build under test" in output
    assert option in output
    assert "Traceback" not in output
    assert "ERROR at setup" not in output
    assert "passed" not in output
