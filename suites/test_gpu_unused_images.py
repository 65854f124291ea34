"""GPU-unused detection on the real CUDA and ROCm images, started where no GPU is.

The images are the reduced variants `scripts/test.sh` builds from the pinned source on
local Debian bases (`harness build --backend cuda|rocm --reduced --container`: trixie's
CUDA 12.4, sid's ROCm 6.4). Each test starts one through the container runner with no
GPU access — ``gpu=None``, said explicitly: the plugin's runner hands a GPU image its GPU
and refuses to start without one — which is what a runner without the NVIDIA container
runtime, or a ROCm container without ``/dev/kfd``, does to a real job:

- the CUDA image without the driver cannot even load (no ``libcuda.so.1``): the
  supervisor classifies ``driver-missing`` and names the fix, with no retry;
- the CUDA image given only the toolkit's driver stub starts on the CPU, and the verdict
  is ``init-failed`` in ggml's own words;
- the ROCm image without ``/dev/kfd`` starts on the CPU: ``init-failed`` too;
- the ROCm image's launch environment: its own probe lists no card here, and launched as
  on an MI300X host (no code for gfx942) the card is hidden and the verdict says so;
- a run demanding CUDA against the CUDA image fails at session start.

Their logs are in the corpus (tests/data/logs/{cuda,rocm}/captured-*.log).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.container_build import pinned_source_image
from harness.client import ServerClient
from harness.facts.build import Backend, BuildInfo
from harness.planning.build_plan import BuildRequest
from harness.planning.container_plan import CUDA_DRIVER_STUB_DIR
from harness.planning.drafter import BrokenDrafters
from harness.planning.launch import LaunchSpec
from harness.planning.rocm_env import parse_rocm_devices, plan_rocm_env
from harness.probes.docker_engine import docker_engine
from harness.probes.gguf_facts import read_model_facts
from harness.probes.rocm_launch import image_rocm_env
from harness.runners.container_runner import ContainerRunner
from harness.supervise.supervisor import LaunchFailedError, LaunchSupervisor
from harness.verdicts.failure import FailureClass
from harness.verdicts.gpu_use import GpuState, gpu_verdict

pytestmark = [pytest.mark.docker, pytest.mark.server]

#: No GPU reaches these containers: the events under test are a GPU build without one.
NO_GPU_ACCESS = None


@pytest.fixture(scope="module")
def cuda_image() -> BuildInfo:
    """The reduced CUDA image (a cache hit once test.sh built it; half an hour if not)."""
    return pinned_source_image(BuildRequest(backend=Backend.CUDA, reduced=True))


@pytest.fixture(scope="module")
def rocm_image() -> BuildInfo:
    return pinned_source_image(BuildRequest(backend=Backend.ROCM, reduced=True))


def _runner(info: BuildInfo, tmp_path: Path, env: dict[str, str] | None = None) -> ContainerRunner:
    assert info.image is not None
    return ContainerRunner(info.image, tmp_path / "logs", ready_timeout_s=180, env=env,
                           gpu=NO_GPU_ACCESS)


def _serve_log(runner: ContainerRunner, model: Path) -> str:
    """Start the fixture as a GPU plan would (-ngl 99), prove it serves, return its log."""
    with runner.start(LaunchSpec(model=model, ctx_size=512, n_gpu_layers=99)) as server:
        with ServerClient(server.base_url, timeout_s=120) as client:
            assert client.completion("hello", n_predict=4).tokens_predicted == 4
        return server.log_text()


def test_the_cuda_image_without_a_driver_is_driver_missing_with_the_fix(
        cuda_image: BuildInfo, fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    model = fixture_set.model("dense")
    supervisor = LaunchSupervisor(_runner(cuda_image, tmp_path), cuda_image.key,
                                  BrokenDrafters(), read_model_facts(model))
    with pytest.raises(LaunchFailedError) as failed:
        supervisor.launch_spec(LaunchSpec(model=model, ctx_size=512, n_gpu_layers=99))
    error = failed.value
    assert error.failure.kind is FailureClass.DRIVER_MISSING, error.failure
    assert "libcuda.so.1" in error.failure.evidence
    # ld.so's status for a library it cannot find; nothing of the server ran.
    assert error.failure.exit_code == 127
    assert len(error.attempts) == 1, "a missing driver is not a failure a retry can fix"
    assert "--gpus" in str(error)
    assert "nvidia-container-toolkit" in str(error)


def test_the_cuda_image_on_the_driver_stub_is_init_failed(
        cuda_image: BuildInfo, fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    runner = _runner(cuda_image, tmp_path, env={"LD_LIBRARY_PATH": CUDA_DRIVER_STUB_DIR})
    log = _serve_log(runner, fixture_set.model("dense"))
    verdict = gpu_verdict(log, "cuda")
    assert not verdict.passed
    (block,) = verdict.blocks
    assert block.state is GpuState.INIT_FAILED, verdict.reason
    assert "CUDA driver is a stub library" in verdict.reason


def test_the_rocm_image_without_kfd_is_init_failed(
        rocm_image: BuildInfo, fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    log = _serve_log(_runner(rocm_image, tmp_path), fixture_set.model("dense"))
    verdict = gpu_verdict(log, "rocm")
    assert not verdict.passed
    (block,) = verdict.blocks
    assert block.state is GpuState.INIT_FAILED, verdict.reason
    assert "ggml_cuda_init: failed to initialize ROCm" in verdict.reason


#: ggml-cuda's init line for the one card of a host with an MI300X (its format string, as
#: tests/data/logs/rocm/used.log shows it): a card the reduced image has no code for.
MI300X_HOST = ("ggml_cuda_init: found 1 ROCm devices:\n  Device 0: AMD Instinct MI300X, "
               "gfx942:sramecc+:xnack- (0x942), VMM: no, Wave Size: 64\n")


def test_the_rocm_image_is_probed_and_launched_with_its_launch_environment(
        rocm_image: BuildInfo, fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    assert rocm_image.image is not None
    client = docker_engine()
    try:
        probed = image_rocm_env(client, rocm_image.image, NO_GPU_ACCESS, rocm_image, {})
    finally:
        client.close()
    # The image's own probe: no card reaches this container, so nothing is hidden.
    assert probed.visible == ()
    assert dict(probed.environment) == {}, probed.describe()
    assert probed.targets == ("gfx1100",)
    # On an MI300X host the image (code for gfx1100 only) is launched with the card hidden,
    # serves on the CPU, and the verdict says so instead of blaming the build.
    planned = plan_rocm_env(probed.targets, parse_rocm_devices(MI300X_HOST), inherited={})
    assert dict(planned.environment) == {"ROCR_VISIBLE_DEVICES": "-1"}
    log = _serve_log(_runner(rocm_image, tmp_path, env=dict(planned.environment)),
                     fixture_set.model("dense"))
    verdict = gpu_verdict(log, "rocm", launch_env=planned)
    (block,) = verdict.blocks
    assert block.state is GpuState.HIDDEN, verdict.reason
    assert "gfx942" in verdict.reason


def test_a_run_requiring_cuda_on_the_cuda_image_fails_at_session_start(
        cuda_image: BuildInfo, tmp_path: Path) -> None:
    assert cuda_image.image is not None
    (tmp_path / "test_plain.py").write_text("def test_plain() -> None:\n    assert True\n")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", str(tmp_path),
         "--harness-runner", "container", "--harness-image", cuda_image.image,
         "--harness-build", cuda_image.key, "--harness-require-gpu", "cuda"],
        capture_output=True, text=True, check=False, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == pytest.ExitCode.USAGE_ERROR, output[-3000:]
    assert "--harness-require-gpu=cuda" in output
    assert "1 passed" not in output, "the test ran although the GPU the run demands is absent"
    # The device: the engine cannot hand the container an NVIDIA GPU. The driver: NVML,
    # which this runner's driver would answer, does not.
    assert "nvidia-container-toolkit" in output, output[-3000:]
    assert "NVML" in output, output[-3000:]
