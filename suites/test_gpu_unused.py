"""GPU-unused detection: a build that silently runs on the CPU is caught and named.

On the CPU build the verdict is "no GPU expected" and passes; the same CPU build launched
where the plan expects a GPU backend is caught as ``not-loaded`` (CUDA, ROCm: the build's
own ``system_info`` lists no such backend) or ``no-usable-gpu`` (Vulkan registers no
features, so a missing backend and a missing driver read alike). GPU-marked tests run on
CUDA, ROCm and Vulkan runners and require a GPU-used verdict for target and drafter. The
verdict corpus (tests/test_log_corpus.py) covers every other outcome everywhere.
"""

from __future__ import annotations

import dataclasses

import pytest

from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo
from harness.plugin import LaunchPlanned, PlanFor
from harness.probes.devices import Device
from harness.verdicts.gpu_use import GpuState, gpu_verdict
from harness.verdicts.launch_log import BlockRole

pytestmark = pytest.mark.server

RTX_4090 = GpuInfo("NVIDIA GeForce RTX 4090", 24564)
#: The dense fixture's head width (16) takes no block-32 cache type; the card's own
#: q8_0/q4_0 would stop the start instead of showing where the weights went.
SMALL = {"ctx_size": 1024, "cache_type_k": "f16", "cache_type_v": "f16"}


def test_cpu_build_with_no_gpu_expected_passes(plan_for: PlanFor, launch: LaunchPlanned,
                                               harness_build: BuildUnderTest) -> None:
    if harness_build.backend is not Backend.CPU:
        pytest.skip(f"the build under test is a {harness_build.backend.value} build")
    server = launch(plan_for(bundle="fused-dense"))
    verdict = gpu_verdict(server.log_text(), None)
    assert verdict.passed, verdict.reason
    states = {b.role: b.state for b in verdict.blocks}
    assert states == {BlockRole.TARGET: GpuState.NO_GPU_EXPECTED,
                      BlockRole.DRAFTER: GpuState.NO_GPU_EXPECTED}


@pytest.mark.parametrize(("expected", "state"), [
    pytest.param("cuda", GpuState.NOT_LOADED, id="cuda"),
    pytest.param("rocm", GpuState.NOT_LOADED, id="rocm"),
    pytest.param("vulkan", GpuState.NO_USABLE_GPU, id="vulkan"),
])
def test_cpu_build_where_a_gpu_is_planned_is_caught(
        expected: str, state: GpuState, plan_for: PlanFor, launch: LaunchPlanned,
        harness_build: BuildUnderTest) -> None:
    if harness_build.backend is not Backend.CPU:
        pytest.skip(f"the build under test is a {harness_build.backend.value} build")
    # Planned for a 4090: every layer to the GPU, drafter included. The CPU build serves
    # anyway — exactly the silent fallback this suite exists to catch.
    plan = plan_for(bundle="fused-dense", gpu=RTX_4090, per_call=SMALL)
    assert plan.spec.n_gpu_layers is not None
    assert plan.spec.n_gpu_layers > 0
    server = launch(plan)
    with ServerClient(server.base_url) as client:
        assert client.completion("hello", n_predict=4).tokens_predicted == 4
    verdict = gpu_verdict(server.log_text(), expected)
    assert not verdict.passed
    assert {b.role for b in verdict.blocks} == {BlockRole.TARGET, BlockRole.DRAFTER}
    assert {b.state for b in verdict.blocks} == {state}, verdict.reason


def _gpu_plan_serves_on_the_gpu(backend: Backend, plan_for: PlanFor, launch: LaunchPlanned,
                                devices: tuple[Device, ...]) -> None:
    device = next(d for d in devices if d.backend is backend)
    plan = plan_for(bundle="fused-dense", gpu=device.gpu_info(), per_call=SMALL)
    spec = dataclasses.replace(plan.spec, n_gpu_layers=99,
                               extra_args=(*plan.spec.extra_args, "--spec-draft-ngl", "99"))
    server = launch(dataclasses.replace(plan, spec=spec))
    verdict = gpu_verdict(server.log_text(), backend.value)
    assert verdict.passed, verdict.reason
    states = {b.role: b.state for b in verdict.blocks}
    assert states == {BlockRole.TARGET: GpuState.USED, BlockRole.DRAFTER: GpuState.USED}


@pytest.mark.gpu("cuda")
def test_cuda_build_uses_the_gpu_for_target_and_drafter(
        plan_for: PlanFor, launch: LaunchPlanned, build_devices: tuple[Device, ...]) -> None:
    _gpu_plan_serves_on_the_gpu(Backend.CUDA, plan_for, launch, build_devices)


@pytest.mark.gpu("rocm")
def test_rocm_build_uses_the_gpu_for_target_and_drafter(
        plan_for: PlanFor, launch: LaunchPlanned, build_devices: tuple[Device, ...]) -> None:
    _gpu_plan_serves_on_the_gpu(Backend.ROCM, plan_for, launch, build_devices)


@pytest.mark.gpu("vulkan")
def test_vulkan_build_uses_the_gpu_for_target_and_drafter(
        plan_for: PlanFor, launch: LaunchPlanned, build_devices: tuple[Device, ...]) -> None:
    _gpu_plan_serves_on_the_gpu(Backend.VULKAN, plan_for, launch, build_devices)
