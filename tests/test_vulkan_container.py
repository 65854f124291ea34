"""The real Vulkan path, in the Vulkan image built on the local Debian 13 base.

No GPU here, only Mesa's software Vulkan driver (llvmpipe). By default llama.cpp skips
CPU-type Vulkan devices, so the server says ``ggml_vulkan: No devices found`` and the
verdict is ``no-devices``; ``GGML_VK_VISIBLE_DEVICES=0`` selects llvmpipe on purpose, the
server really offloads to it, and the verdict is ``software-device`` — never "GPU used".
The logs of both are in the corpus (tests/data/logs/vulkan/captured-*.log).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.container_build import pinned_source_image
from harness.client import ServerClient
from harness.facts.build import Backend, BuildInfo
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners.container_runner import ContainerRunner
from harness.runners.driver_cache import driver_cache_dir
from harness.verdicts.gpu_use import GpuState, gpu_verdict

pytestmark = [pytest.mark.docker, pytest.mark.server]


def vulkan_build() -> BuildInfo:
    """The Vulkan image build of the pinned source (a cache hit once test.sh built it)."""
    return pinned_source_image(BuildRequest(backend=Backend.VULKAN))


@pytest.fixture(scope="module")
def vulkan_image() -> str:
    """The Vulkan image of the pinned source (`harness build --backend vulkan --container`)."""
    info = vulkan_build()
    assert "draft-mtp" in info.capabilities.spec_types
    assert info.image is not None
    return info.image


def _serve(image: str, model: Path, tmp_path: Path, env: dict[str, str] | None) -> str:
    runner = ContainerRunner(image, tmp_path / "logs", ready_timeout_s=180, env=env)
    with runner.start(LaunchSpec(model=model, ctx_size=512, n_gpu_layers=99)) as server:
        with ServerClient(server.base_url, timeout_s=120) as client:
            assert client.completion("hello", n_predict=4).tokens_predicted == 4
        return server.log_text()


def test_no_usable_vulkan_device_is_no_devices(vulkan_image: str,
                                               fixture_set: modelgen.FixtureSet,
                                               tmp_path: Path) -> None:
    log = _serve(vulkan_image, fixture_set.model("dense"), tmp_path, None)
    assert "ggml_vulkan: No devices found" in log
    verdict = gpu_verdict(log, "vulkan")
    assert not verdict.passed
    assert verdict.blocks[0].state is GpuState.NO_DEVICES


def test_llvmpipe_is_a_software_device_not_a_gpu(vulkan_image: str,
                                                 fixture_set: modelgen.FixtureSet,
                                                 tmp_path: Path) -> None:
    log = _serve(vulkan_image, fixture_set.model("dense"), tmp_path,
                 {"GGML_VK_VISIBLE_DEVICES": "0"})
    assert "llvmpipe" in log
    verdict = gpu_verdict(log, "vulkan")
    block = verdict.blocks[0]
    assert block.state is GpuState.SOFTWARE_DEVICE
    assert block.device == "Vulkan0"
    assert block.gpu_mib.get("Vulkan0", 0) > 0  # it really offloaded, to a CPU-run device
    assert not verdict.passed
    assert gpu_verdict(log, "vulkan", allow_software_device=True).passed
    # Mesa kept what llvmpipe compiled in the runner's driver cache: the next container
    # start reuses it (about 36 s of compiling on this machine otherwise).
    cache = driver_cache_dir()
    assert cache is not None
    assert any(path.is_file() for path in (cache / "mesa").rglob("*")), (
        f"nothing in Mesa's shader cache {cache / 'mesa'} after a llvmpipe server")
