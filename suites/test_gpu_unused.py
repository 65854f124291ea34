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
from decimal import Decimal
from pathlib import Path

import gguf
import pytest

from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo
from harness.facts.model_facts import ModelFacts
from harness.planning.launch_plan import LaunchPlan
from harness.planning.planned_share import (
    MIB,
    NonLayerBytes,
    Offload,
    OffloadRequest,
    PlannedShare,
    non_layer_bytes,
    planned_gpu_share,
)
from harness.plugin import LaunchPlanned, PlanFor
from harness.plugin.session import HarnessSession
from harness.probes.devices import Device
from harness.probes.gguf_facts import read_model_facts
from harness.verdicts.gpu_use import GpuState, gpu_verdict
from harness.verdicts.log_blocks import BlockRole
from harness.verdicts.residency import (
    HALF_PRINTED_UNIT_BYTES,
    ResidencyVerdict,
    ShareOutcome,
    residency_verdict,
)

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
        expected: str, state: GpuState, *, plan_for: PlanFor, launch: LaunchPlanned,
        harness_build: BuildUnderTest, pytestconfig: pytest.Config) -> None:
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
    in_image = HarnessSession.of(pytestconfig).options.runner == "container"
    if (state is GpuState.NO_USABLE_GPU and not in_image and harness_build.info
            and harness_build.info.rpc_server):
        # With the RPC backend built in, llama_supports_gpu_offload is true (it counts
        # RPC), so the "no usable GPU found" warning is never printed: the plain CPU
        # build's Vulkan tell is gone, and the verdict is the general one. (A container
        # run's image is the plain build: images carry no RPC backend.)
        state = GpuState.NOT_LOADED
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


# --- how much sits on the GPU (harness/verdicts/residency.py) -------------------------------
#
# The share ``ollama ps`` shows, read from the server's buffer lines, held against the share
# the plan's flags put on the GPU. On the CPU build it must be 0 % GPU with every weight in
# host memory; planned for a GPU, the same CPU build shows the share it missed; on a GPU
# runner target and drafter must hold their planned share.


def _model_split(path: Path) -> tuple[ModelFacts, NonLayerBytes]:
    facts = read_model_facts(path)
    tensors = ((str(t.name), int(t.n_bytes)) for t in gguf.GGUFReader(path).tensors)
    return facts, non_layer_bytes(tensors, facts.block_count)


def _planned_shares(plan: LaunchPlan, drafter: OffloadRequest, *, gpu_device: bool,
                    ) -> dict[BlockRole, PlannedShare]:
    """The planned share of the target (by the plan's own flags) and of its drafter."""
    assert plan.spec.drafter is not None, "the bundle's plan has a drafter"
    shares = {}
    for role, path, flags in ((BlockRole.TARGET, plan.spec.model, plan.spec),
                              (BlockRole.DRAFTER, plan.spec.drafter, drafter)):
        facts, split = _model_split(path)
        shares[role] = planned_gpu_share(facts, flags, split, gpu_device=gpu_device)
    return shares


def _held(verdict: ResidencyVerdict, role: BlockRole) -> Decimal:
    block = verdict.block(role)
    assert block is not None, f"no {role.value} block in the log"
    return block.weights_host_mib


def test_cpu_build_holds_every_weight_in_host_memory(plan_for: PlanFor, launch: LaunchPlanned,
                                                      harness_build: BuildUnderTest) -> None:
    if harness_build.backend is not Backend.CPU:
        pytest.skip(f"the build under test is a {harness_build.backend.value} build")
    plan = plan_for(bundle="fused-dense")
    server = launch(plan)
    planned = _planned_shares(plan, Offload(), gpu_device=False)
    verdict = residency_verdict(server.log_text(), planned)
    assert verdict.warnings == (), verdict.warnings
    assert [c.outcome for c in verdict.checks] == [ShareOutcome.AS_PLANNED] * 2
    for role, share in planned.items():
        block = verdict.block(role)
        assert block is not None
        assert (block.processor, block.gpu_percent) == ("100% CPU", 0), block
        assert block.weights_gpu_mib == block.kv_gpu_mib == 0
        assert block.kv_host_mib > 0
        # CPU_Mapped maps the file from its first tensor to its last: all the weights, to
        # the printed hundredth of a MiB.
        assert _held(verdict, role) * MIB >= share.total_bytes - HALF_PRINTED_UNIT_BYTES


def test_cpu_build_where_a_gpu_is_planned_shows_the_share_it_missed(
        plan_for: PlanFor, launch: LaunchPlanned, harness_build: BuildUnderTest) -> None:
    if harness_build.backend is not Backend.CPU:
        pytest.skip(f"the build under test is a {harness_build.backend.value} build")
    plan = plan_for(bundle="fused-dense", gpu=RTX_4090, per_call=SMALL)
    server = launch(plan)
    # The drafter's -ngl is the server's to pick (--fit); with no GPU line in the log the
    # plan counts it as all layers, as llama.cpp does when nothing fits it.
    planned = _planned_shares(plan, Offload(), gpu_device=True)
    verdict = residency_verdict(server.log_text(), planned)
    assert [c.outcome for c in verdict.checks] == [ShareOutcome.MORE_ON_HOST] * 2
    for check in verdict.checks:
        low, _ = check.planned.gpu_share_range
        assert low > 0.5, check.planned.describe()
        # The warning carries both: what was planned and what the log shows.
        assert check.message in verdict.warnings
        assert f"planned {check.planned.describe()}" in check.message
        assert "observed 100% CPU" in check.message


@pytest.mark.parametrize("backend", [
    pytest.param(Backend.CUDA, marks=pytest.mark.gpu("cuda"), id="cuda"),
    pytest.param(Backend.ROCM, marks=pytest.mark.gpu("rocm"), id="rocm"),
    pytest.param(Backend.VULKAN, marks=pytest.mark.gpu("vulkan"), id="vulkan"),
])
def test_gpu_build_holds_the_planned_share_for_target_and_drafter(
        backend: Backend, plan_for: PlanFor, launch: LaunchPlanned,
        build_devices: tuple[Device, ...]) -> None:
    device = next(d for d in build_devices if d.backend is backend)
    plan = plan_for(bundle="fused-dense", gpu=device.gpu_info(), per_call=SMALL)
    spec = dataclasses.replace(plan.spec, n_gpu_layers=99,
                               extra_args=(*plan.spec.extra_args, "--spec-draft-ngl", "99"))
    plan = dataclasses.replace(plan, spec=spec)
    server = launch(plan)
    planned = _planned_shares(plan, Offload(n_gpu_layers=99), gpu_device=True)
    verdict = residency_verdict(server.log_text(), planned)
    assert verdict.warnings == (), verdict.warnings
    assert [c.outcome for c in verdict.checks] == [ShareOutcome.AS_PLANNED] * 2
    for role in planned:
        block = verdict.block(role)
        assert block is not None
        assert block.weights_gpu_mib > 0
        # The KV cache is offloaded with the layers (no --no-kv-offload in the plan).
        assert block.kv_gpu_mib > 0
        assert block.kv_host_mib == 0
        # load_tensors keeps the input layer (token_embd) on the CPU whatever -ngl says.
        facts, split = _model_split(plan.spec.model if role is BlockRole.TARGET
                                    else Path(str(plan.spec.drafter)))
        assert _held(verdict, role) * MIB >= split.input - HALF_PRINTED_UNIT_BYTES, facts.path
