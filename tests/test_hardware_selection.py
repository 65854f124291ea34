"""Hardware markers, --harness-require-gpu and --harness-build, run as a user runs pytest."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.facts.build import Backend
from harness.plugin.required import REQUIRE_ENV
from harness.probes.devices import parse_device_list

pytest_plugins = ["pytester"]

GPU_TEST = """
import pytest

@pytest.mark.gpu("cuda")
def test_needs_cuda():
    assert False, "must not run without a CUDA device"

def test_runs_everywhere(llama_server_binary):
    assert llama_server_binary.is_file()
"""


def test_device_list_of_a_cpu_build_is_empty() -> None:
    assert parse_device_list("Available devices:\n  (none)\n") == ()


def test_device_lines_name_backend_and_memory() -> None:
    # Format of common/arg.cpp's --list-devices: "  %s: %s (%zu MiB, %zu MiB free)".
    text = ("Available devices:\n"
            "  CUDA0: NVIDIA H200 (143771 MiB, 142990 MiB free)\n"
            "  Vulkan0: llvmpipe (LLVM 19.1.7, 256 bits) (32000 MiB, 32000 MiB free)\n")
    cuda, vulkan = parse_device_list(text)
    assert (cuda.name, cuda.backend, cuda.total_mib, cuda.free_mib) == (
        "CUDA0", Backend.CUDA, 143771, 142990)
    assert cuda.gpu_info().name == "NVIDIA H200"
    assert vulkan.backend is Backend.VULKAN
    assert vulkan.description == "llvmpipe (LLVM 19.1.7, 256 bits)"


@pytest.mark.server
def test_a_gpu_test_is_skipped_with_a_reason_on_a_cpu_build(
        pytester: pytest.Pytester, llama_server_binary: Path) -> None:
    pytester.makepyfile(GPU_TEST)
    result = pytester.runpytest_subprocess("-rs", f"--harness-build={llama_server_binary}")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*needs a cuda build and device*is a cpu build*"])


@pytest.mark.server
def test_requiring_a_missing_gpu_fails_at_session_start(
        pytester: pytest.Pytester, llama_server_binary: Path) -> None:
    pytester.makepyfile(GPU_TEST)
    result = pytester.runpytest_subprocess(f"--harness-build={llama_server_binary}",
                                           "--harness-require-gpu=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "--harness-require-gpu=cuda: the build under test" in output
    assert "is a cpu build" in output
    assert "passed" not in output  # not even the test that runs everywhere


@pytest.mark.server
def test_a_build_json_selects_its_binary(pytester: pytest.Pytester,
                                         llama_server_binary: Path) -> None:
    record = llama_server_binary.parent.parent / "build.json"
    if not record.is_file():
        pytest.skip(f"{llama_server_binary} has no build.json beside it (not a harness build)")
    pytester.makepyfile(f"""
        def test_binary(harness_build, llama_server_binary):
            assert str(llama_server_binary) == {str(llama_server_binary)!r}
            assert harness_build.info is not None
            assert harness_build.backend.value == "cpu"
    """)
    result = pytester.runpytest_subprocess(f"--harness-build={record}")
    result.assert_outcomes(passed=1)


def test_an_unknown_build_key_lists_the_known_ones(pytester: pytest.Pytester,
                                                   tmp_path: Path) -> None:
    pytester.makepyfile("def test_x(llama_server_binary): pass")
    result = pytester.runpytest_subprocess("--harness-build=cpu-0000000000000000",
                                           f"--basetemp={tmp_path / 'bt'}")
    assert result.ret != 0
    result.stdout.fnmatch_lines(["*neither a build.json, a llama-server binary nor a build key*"])


def test_the_container_runner_without_an_engine_fails_at_session_start(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    pytester.makepyfile("def test_x():\n    pass\n")
    result = pytester.runpytest_subprocess("--harness-runner=container")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "--harness-runner=container: no Docker engine answers" in output
    assert "dockerd --bridge=none --iptables=false" in output


def test_docker_tests_skip_with_the_reason_when_no_engine_answers(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")
    # Where docker is required (CI sets it) the same test fails: tests/test_required.py.
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    pytester.makepyfile("""
        import pytest

        @pytest.mark.docker
        def test_needs_docker():
            assert False, "must not run without an engine"
    """)
    result = pytester.runpytest_subprocess("-rs")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*no Docker engine answers*"])
