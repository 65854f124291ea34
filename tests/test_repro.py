"""``harness repro``: a failure recorded by a real run, reproduced on the real build.

The end-to-end tests write a tiny test module that starts the dense fixture through the
harness's fixtures and asserts something false about its completion, run it once with
Allure results, and reproduce that failure from the result file, from a stored run on a
loopback results service (by run and node id, and by report URL), and against a server
started by hand from the command line ``harness repro`` printed. The command object is
invoked directly (the lead registers it in the ``harness`` group).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import service_helpers
from click.testing import CliRunner, Result
from results_fixtures import make_run

from harness.builds.native import builds_dir
from harness.builds.resolve import pinned_cpu_build
from harness.commands.repro import repro_command
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo
from harness.paths import cache_root
from harness.planning.build_plan import SUITE_BUILD, BuildRequest
from harness.report.allure_meta import environment_properties
from harness.repro.command import (
    docker_command,
    for_external,
    local_command,
    map_path,
)
from harness.repro.properties import (
    parse_gpu_spec,
    parse_properties,
    recorded_cmake_flags,
    recorded_planner_gpu,
    repro_properties,
)
from harness.repro.recorded_build import (
    RecordedBuild,
    build_command,
    ensure_recorded_build,
    find_cached_build,
    request_from_flags,
)
from harness.repro.recorded_failure import recorded_failure
from harness.repro.repro_error import ReproError
from harness.repro.rerun import Outcome, Rerun, rerun_env, verdict
from harness.repro.target import FileTarget, ServiceTarget, parse_report_url, parse_target
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import make_bundle
from harness.service.settings import ServiceSettings
from harness.service.upload_client import upload_bundle

TOKEN = "repro-token-" + "r" * 20
FAILING = "test_repro_demo.py::test_completion_is_wrong"
PLANNER = "test_repro_demo.py::test_planner_sees_the_4090"
RTX_4090 = "NVIDIA GeForce RTX 4090:24564"
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")

DEMO_MODULE = '''
from harness.client import ServerClient
from harness.planning.launch import LaunchSpec


def test_completion_is_wrong(start_server, fixture_set):
    server = start_server(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512))
    with ServerClient(server.base_url) as client:
        completion = client.completion("Hello", n_predict=4)
    assert completion.content == "certainly not this"


def test_planner_sees_the_4090(plan_for):
    # Passes only when plan_for's default GPU is the RTX 4090 (--harness-planner-gpu).
    assert plan_for(model="dense").tune.label == "rtx-4090"
'''


# --- pure parts ----------------------------------------------------------------------------


def test_properties_read_back_what_the_writer_escapes() -> None:
    props = {"build.cmake_flags": json.dumps(["-DA=B C", "-DX:Y=#1"]),
             "gpu.name": "NVIDIA H200 ünïcode 🚀", " leading key": " leading value",
             "tabs\tand\nlines": "a\\b=c:d!e"}
    assert parse_properties(environment_properties(props)) == props


def test_properties_parser_reads_java_syntax() -> None:
    text = "# comment\n! also\n\nplain = value\ncolon: x\nspaced   y\ncont=a\\\n    b\n"
    assert parse_properties(text) == {"plain": "value", "colon": "x", "spaced": "y",
                                      "cont": "ab"}


def test_repro_properties_round_trip() -> None:
    props = repro_properties(cmake_flags=("-DA=1", "-DB=2 3"),
                             planner_gpu=GpuInfo("NVIDIA: H200", 143771), rootdir=Path("/r"))
    assert recorded_cmake_flags(props) == ("-DA=1", "-DB=2 3")
    assert recorded_planner_gpu(props) == GpuInfo("NVIDIA: H200", 143771)
    assert props["pytest.rootdir"] == "/r"
    none = repro_properties(cmake_flags=None, planner_gpu=None, rootdir=Path("/r"))
    assert recorded_planner_gpu(none) is None
    assert recorded_cmake_flags(none) is None
    # A run recorded before planner.gpu existed planned without a default GPU.
    assert recorded_planner_gpu({"gpu.name": "NVIDIA H200", "gpu.vram_mib": "143771"}) is None


@pytest.mark.parametrize("text", ["H200", "H200:", ":100", "H200:0", "H200:12x"])
def test_bad_gpu_spec_names_the_format(text: str) -> None:
    with pytest.raises(ConfigError, match="is not NAME:VRAM_MIB"):
        parse_gpu_spec(text)


def test_gpu_spec_takes_the_last_field_as_vram() -> None:
    assert parse_gpu_spec("AMD Radeon: RX 7900 XTX:24560") == GpuInfo("AMD Radeon: RX 7900 XTX",
                                                                       24560)


@pytest.mark.parametrize("request_", [
    BuildRequest(), BuildRequest(native=True), BuildRequest(rpc=True),
    BuildRequest(rpc=True, extra_cmake_args=("-DX=1",)),
    BuildRequest(backend=Backend.CUDA, extra_cmake_args=("-DCMAKE_CUDA_ARCHITECTURES=90",)),
])
def test_request_from_flags_inverts_cmake_flags(request_: BuildRequest) -> None:
    assert request_from_flags(request_.backend, request_.cmake_flags()) == request_


def test_flags_harness_build_never_makes_are_refused() -> None:
    with pytest.raises(ReproError, match="made by another tool"):
        request_from_flags(Backend.CPU, ("-DCMAKE_BUILD_TYPE=Debug",))


def test_build_command_names_every_input() -> None:
    flags = BuildRequest(backend=Backend.CUDA, native=True, extra_cmake_args=("-DX=1",))
    recorded = RecordedBuild(Backend.CUDA, "d" * 64, "cuda-k", flags.cmake_flags())
    assert build_command(recorded) == ("harness build --backend cuda --source PATH --native "
                                       "--cmake-arg -DX=1")


def test_report_urls_name_service_run_and_result() -> None:
    uuid = "5bf2092d-636c-47e0-8ee8-1822de5c287d"
    md5 = hashlib.md5(uuid.encode()).hexdigest()
    assert parse_report_url(f"http://h:8080/runs/r-1/report/index.html#/testresult/{md5}") == \
        ServiceTarget("http://h:8080", "r-1", None, md5)
    assert parse_report_url(f"https://h/runs/r-1/report/#{uuid.upper()}").result_id == uuid
    assert parse_report_url("http://h/runs/r-1/report/", test="t.py::x") == \
        ServiceTarget("http://h", "r-1", "t.py::x", None)
    with pytest.raises(ReproError, match="no test result: open the failed test"):
        parse_report_url("http://h/runs/r-1/report/index.html")
    with pytest.raises(ReproError, match="is not a report URL"):
        parse_report_url("http://h/api/runs/r-1")


def test_targets_need_a_complete_address() -> None:
    assert parse_target("x-result.json", run_id=None, test=None, service=None) == \
        FileTarget(Path("x-result.json"))
    assert parse_target(None, run_id="r", test="t", service="http://h/") == \
        ServiceTarget("http://h", "r", "t")
    with pytest.raises(ReproError, match="needs --test NODEID"):
        parse_target(None, run_id="r", test=None, service="http://h")
    with pytest.raises(ReproError, match="needs --service URL"):
        parse_target(None, run_id="r", test="t", service=None)
    with pytest.raises(ReproError, match="nothing to reproduce"):
        parse_target(None, run_id=None, test=None, service=None)
    with pytest.raises(ReproError, match="not both"):
        parse_target("x.json", run_id="r", test="t", service="http://h")


def test_recorded_paths_map_to_local_fixtures_by_their_tail(tmp_path: Path) -> None:
    index = {"models/dense.gguf": tmp_path / "models/dense.gguf",
             "bundles/fused-dense": tmp_path / "bundles/fused-dense",
             "bundles/fused-dense/drafter.gguf": tmp_path / "bundles/fused-dense/drafter.gguf"}
    ci = "/home/ci/.cache/llama-harness/fixtures/0123456789abcdef"
    assert map_path(f"{ci}/bundles/fused-dense/drafter.gguf", index) == \
        tmp_path / "bundles/fused-dense/drafter.gguf"
    command = local_command(
        ["/ci/bin/llama-server", "--port", "0", "--model", f"{ci}/models/dense.gguf",
         "--spec-draft-model", "/tmp/pytest-7/corrupt.gguf", "--threads", "1"],
        "/here/llama-server", index)
    assert command.argv == ("/here/llama-server", "--port", "0", "--model",
                            str(tmp_path / "models/dense.gguf"), "--spec-draft-model",
                            "/tmp/pytest-7/corrupt.gguf", "--threads", "1")
    assert command.unmapped == ("/tmp/pytest-7/corrupt.gguf",)
    external = for_external(command, "http://127.0.0.1:9999")
    assert external.argv[2] == "9999"
    docker = docker_command(command, "sha256:abc")
    assert f"{tmp_path / 'models/dense.gguf'}:{tmp_path / 'models/dense.gguf'}:ro" in docker.argv
    assert not any("corrupt" in arg for arg in docker.argv[:docker.argv.index("sha256:abc")])


def _recorded(status: str = "failed", message: str = "AssertionError: a\nmore") -> Any:
    return recorded_failure(
        {"uuid": "u", "status": status, "statusDetails": {"message": message},
         "labels": [{"name": "nodeid", "value": "t.py::x"}]}, "a=b\n", {}, "origin")


def test_verdict_compares_status_and_first_line() -> None:
    recorded = _recorded()
    assert verdict(recorded, Outcome("failed", "AssertionError: a\nother")) == \
        (True, "reproduced: failed again, the same way: AssertionError: a")
    same_kind, words = verdict(recorded, Outcome("broken", "ServerError: boom"))
    assert same_kind
    assert "a different one" in words
    assert verdict(recorded, Outcome("passed", ""))[0] is False
    assert verdict(recorded, None)[0] is False


def test_a_result_without_environment_or_nodeid_says_what_to_do() -> None:
    with pytest.raises(ReproError, match=r"no environment\.properties beside the result"):
        recorded_failure({"uuid": "u"}, None, {}, "r.json")
    with pytest.raises(ReproError, match="name the test with --test NODEID"):
        recorded_failure({"uuid": "u", "labels": []}, "a=b\n", {}, "r.json")
    with pytest.raises(ReproError, match="attachment 'server 1 argv'"):
        recorded_failure({"uuid": "u", "attachments": [
            {"name": "server 1 argv", "source": "x-attachment.txt"}]}, "", {}, "r.json", "t")


def test_rerun_argv_and_environment() -> None:
    rerun = Rerun(nodeid="t.py::x", rootdir=Path("/r"), build_json=Path("/b/build.json"),
                  alluredir=Path("/a"), planner_gpu=GpuInfo("H200", 1000),
                  external="http://127.0.0.1:1", image="sha256:abc")
    argv = rerun.argv("python")
    assert argv[:4] == ["python", "-m", "pytest", "t.py::x"]
    for expected in ("--harness-build=/b/build.json", "--harness-planner-gpu=H200:1000",
                     "--harness-external-server=http://127.0.0.1:1",
                     "--harness-runner=container", "--harness-image=sha256:abc",
                     "--harness-known-flakes=none"):
        assert expected in argv
    env = rerun_env({"HARNESS_PLANNER_GPU": "X:1", "HARNESS_CACHE": "/c",
                     "PYTEST_XDIST_WORKER_COUNT": "2", "PYTEST_ADDOPTS": "-x"})
    assert env == {"HARNESS_CACHE": "/c", "PYTEST_ADDOPTS": "-x"}


# --- the build --------------------------------------------------------------------------


def _pinned_build() -> RecordedBuild:
    built = pinned_cpu_build(cache_root())
    assert built is not None, "the CPU build of the pinned source is not cached; run " \
                              "`harness build --backend cpu` first"
    info = built.info
    return RecordedBuild(info.backend, info.source_digest, info.key, info.cmake_flags)


def test_the_cached_build_is_found_by_key_and_by_inputs(tmp_path: Path) -> None:
    recorded = _pinned_build()
    found = find_cached_build(cache_root(), recorded)
    assert found is not None
    assert found[1] == builds_dir(cache_root()) / recorded.key / "build.json"
    # Another key (another compiler) with the same inputs is the same build.
    cache = tmp_path / "cache"
    other = builds_dir(cache) / "cpu-from-another-compiler"
    other.mkdir(parents=True)
    shutil.copy(found[1], other / "build.json")
    again = find_cached_build(cache, recorded)
    assert again is not None
    assert again[1] == other / "build.json"
    # Other flags are another build.
    native = RecordedBuild(recorded.backend, recorded.source_digest, "cpu-x",
                           BuildRequest(native=True).cmake_flags())
    assert find_cached_build(cache, native) is None


def test_an_unknown_digest_names_itself_and_the_fix(tmp_path: Path) -> None:
    recorded = RecordedBuild(Backend.CPU, "f" * 64, "cpu-nowhere", None)
    with pytest.raises(ReproError) as caught:
        ensure_recorded_build(tmp_path, recorded, None)
    message = str(caught.value)
    assert "f" * 64 in message
    assert "not the pinned source" in message
    assert "harness build --backend cpu --source PATH" in message
    # A --source tree that hashes to something else is named, with its digest.
    tree = tmp_path / "llama.cpp"
    (tree / "tools" / "server").mkdir(parents=True)
    (tree / "CMakeLists.txt").write_text("project(x)\n")
    with pytest.raises(ReproError, match=rf"--source {tree} hashes to [0-9a-f]{{64}}, not to"):
        ensure_recorded_build(tmp_path, recorded, tree)


# --- end to end ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Recorded:
    results: Path
    output: str

    def result_of(self, nodeid: str) -> Path:
        for path in self.results.glob("*-result.json"):
            body = json.loads(path.read_text(encoding="utf-8"))
            labels = {label["name"]: label["value"] for label in body["labels"]}
            if labels.get("nodeid") == nodeid:
                return path
        raise AssertionError(f"no result for {nodeid}:\n{self.output}")


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items()
            if not k.startswith(("PYTEST_", "HARNESS_PLANNER_GPU", "HARNESS_KNOWN_FLAKES"))}


@pytest.fixture(scope="module")
def recorded_run(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """The demo module, run once with Allure results and the RTX 4090 as planner GPU."""
    work = tmp_path_factory.mktemp("recorded")
    (work / "test_repro_demo.py").write_text(DEMO_MODULE)
    results = work / "allure-results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_repro_demo.py", "-p", "no:xdist",
         "-p", "no:cacheprovider", "-q", f"--alluredir={results}",
         f"--harness-planner-gpu={RTX_4090}"],
        cwd=work, env=_clean_env(), capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "1 failed, 1 passed" in output, output
    return Recorded(results, output)


def _repro(*args: str) -> Result:
    return CliRunner().invoke(repro_command, list(args), env={"PYTEST_ADDOPTS": None})


def _failed_the_same_way(answer: Result) -> None:
    assert answer.exit_code == 1, answer.output
    assert "collected 1 item" in answer.output
    assert "1 failed in" in answer.output
    assert ("outcome: reproduced: failed again, the same way: AssertionError: assert "
            "' hello hello hello hello' == 'certainly not this'") in answer.output


def _printed_command(output: str) -> list[str]:
    lines = output.splitlines()
    index = lines.index("server 1 command (run it by hand, or under `gdb --args`):")
    return shlex.split(lines[index + 1])


@pytest.mark.server
def test_repro_from_a_result_file_fails_the_same_way(recorded_run: Recorded) -> None:
    result = recorded_run.result_of(FAILING)
    answer = _repro(str(result))
    _failed_the_same_way(answer)
    assert f"test:     {FAILING}" in answer.output
    # The rerun was exactly that test, on the cached build, planned for the run's GPU.
    rerun = next(line for line in answer.output.splitlines() if line.startswith("rerun "))
    built = pinned_cpu_build(cache_root(), SUITE_BUILD)  # the build the recorded run used
    assert built is not None
    assert shlex.split(rerun.split(": ", 1)[1])[:3] == ["pytest", FAILING,
                                                         f"--rootdir={result.parent.parent}"]
    assert f"--harness-build={builds_dir(cache_root()) / built.info.key / 'build.json'}" in rerun
    assert f"--harness-planner-gpu={RTX_4090}" in shlex.split(rerun.split(": ", 1)[1])
    argv = _printed_command(answer.output)
    assert argv[0] == built.info.binary
    assert Path(argv[argv.index("--model") + 1]).is_file()


@pytest.mark.server
def test_the_printed_command_starts_the_server_by_hand(recorded_run: Recorded,
                                                       tmp_path: Path) -> None:
    answer = _repro(str(recorded_run.result_of(FAILING)))
    argv = _printed_command(answer.output)
    assert argv[argv.index("--port") + 1] == "0"
    with _StartedServer(argv, tmp_path / "by-hand.log") as url:
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        # And the test attaches to it with --external: same failure, the warning shown.
        external = _repro(str(recorded_run.result_of(FAILING)), "--external", url)
        _failed_the_same_way(external)
        assert "launch flags are your responsibility" in external.output
        port = url.rsplit(":", 1)[1]
        shown = _printed_command(external.output)
        assert shown[shown.index("--port") + 1] == port
        assert f"--harness-external-server={url}" in external.output


@pytest.mark.server
def test_the_planner_gpu_is_the_runs_unless_local_is_asked(recorded_run: Recorded) -> None:
    result = str(recorded_run.result_of(PLANNER))
    again = _repro(result)
    assert again.exit_code == 0, again.output
    assert "outcome: reproduced: passed again" in again.output
    local = _repro(result, "--local-gpu")
    # This machine has no GPU: the plan has none, so the test's 4090 check fails.
    assert local.exit_code == 1, local.output
    assert "planner GPU: none (this machine)" in local.output
    assert "outcome: did not reproduce: recorded passed, now failed" in local.output


@pytest.mark.server
def test_repro_from_the_results_service(recorded_run: Recorded, tmp_path: Path) -> None:
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_run("repro-run").to_json()))
    bundle = make_bundle(run_json, recorded_run.results, tmp_path / "bundle.tar.gz")
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token=TOKEN,
                                     results_url=f"sqlite:///{tmp_path / 'r.sqlite'}",
                                     report_generator=service_helpers.no_report))
    failing = json.loads(recorded_run.result_of(FAILING).read_text())
    with serve_in_thread(app) as url:
        assert upload_bundle(url, bundle, TOKEN).created
        _check_results_route(url, failing)
        by_test = _repro("--run", "repro-run", "--test", FAILING, "--service", url)
        _failed_the_same_way(by_test)
        assert "from:     run repro-run on " in by_test.output
        allure_id = hashlib.md5(failing["uuid"].encode()).hexdigest()
        by_url = _repro(f"{url}/runs/repro-run/report/index.html#/testresult/{allure_id}")
        _failed_the_same_way(by_url)
        unknown = _repro("--run", "repro-run", "--test", "nope.py::x", "--service", url)
        assert unknown.exit_code == 2
        assert "holds no Allure result for test 'nope.py::x'" in unknown.output


def _check_results_route(url: str, failing: dict[str, Any]) -> None:
    with httpx.Client(base_url=url, timeout=30) as client:
        by_test = client.get("/api/runs/repro-run/results", params={"test": FAILING}).json()
        assert [r["result"]["uuid"] for r in by_test["results"]] == [failing["uuid"]]
        assert "build.source_digest=" in by_test["environment"]
        argv = next(a["source"] for a in failing["attachments"] if a["name"] == "server 1 argv")
        assert "--ctx-size 512" in by_test["results"][0]["attachments"][argv]
        by_uuid = client.get("/api/runs/repro-run/results", params={"result": failing["uuid"]})
        assert by_uuid.json()["results"][0]["result"]["uuid"] == failing["uuid"]
        assert client.get("/api/runs/repro-run/results").status_code == 400
        missing = client.get("/api/runs/no-such-run/results", params={"test": FAILING})
        assert missing.status_code == 404
        assert "no run 'no-such-run'" in missing.json()["error"]


@pytest.mark.server
def test_a_build_that_is_nowhere_is_named_with_its_fix(recorded_run: Recorded,
                                                       tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(recorded_run.results, results)
    env_file = results / "environment.properties"
    props = parse_properties(env_file.read_text())
    props.update({"build.source_digest": "e" * 64, "build.key": "cpu-nowhere"})
    env_file.write_text(environment_properties(props))
    answer = _repro(str(results / recorded_run.result_of(FAILING).name))
    assert answer.exit_code == 2, answer.output
    assert "e" * 64 in answer.output
    assert "harness build --backend cpu --source PATH" in answer.output
    assert "rerun" not in answer.output


class _StartedServer:
    """A server run the way a developer would from the printed line; killed on exit."""

    def __init__(self, argv: list[str], log: Path) -> None:
        self.argv = argv
        self.log = log
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> str:
        with self.log.open("wb") as handle:
            self.process = subprocess.Popen(self.argv, stdout=handle, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            match = LISTENING.search(self.log.read_text(errors="replace"))
            if match:
                url = f"http://127.0.0.1:{match.group(1)}"
                if _healthy(url):
                    return url
            assert self.process.poll() is None, self.log.read_text(errors="replace")
            time.sleep(0.05)
        raise AssertionError(f"the hand-started server never served:\n{self.log.read_text()}")

    def __exit__(self, *exc: object) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait(30)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False



@pytest.mark.server
def test_a_container_run_needs_its_exact_image(recorded_run: Recorded, tmp_path: Path) -> None:
    """Without an engine, or with one lacking the image, the answer says how to get it."""
    results = tmp_path / "results"
    shutil.copytree(recorded_run.results, results)
    env_file = results / "environment.properties"
    props = parse_properties(env_file.read_text())
    props.update({"build.image": "harness/llama-server:cpu-gone",
                  "build.image_digest": "sha256:" + "0" * 64})
    env_file.write_text(environment_properties(props))
    answer = _repro(str(results / recorded_run.result_of(FAILING).name))
    assert answer.exit_code == 2, answer.output
    # The recorded build is the suites' (RPC backend): its switch goes to the image build.
    assert ("no Docker engine answers" in answer.output
            or "harness build --backend cpu --source PATH --cmake-arg -DGGML_RPC=ON --container"
            in answer.output)
    assert "rerun" not in answer.output
