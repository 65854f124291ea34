"""Offload ladders: MoE and dense offload plans reach the server, and an out-of-memory start
retreats one rung per OOM (reference 003's planner and degrade ladders, docs/references.md).

The fixtures are tiny, so the planner is given facts at scale: every tensor size of the
fixture multiplied by ``SCALE`` (a 2-block model of some hundred MiB per block), and a GPU
whose VRAM holds the residue and only the last block's experts (MoE) or dense FFN
(dense). What the server moved is read from its own log: at ``-lv 5`` llama-model.cpp
names every tensor an override sent to the CPU (``tensor blk.0.ffn_gate_exps.weight
(0 MiB f32) buffer type overridden to CPU``, measured on the pinned build).

On a CPU build the OOM injector stands in for the GPU; the tests marked ``gpu`` produce
a real out-of-memory start on a GPU runner instead (``--fit off``, every layer on the
GPU, a KV cache larger than the device: docs/design.md's measured recipe, sized to the device).

The module stays whole: it is one suite (one capability, one Allure suite label), and its
tests share the scaled facts and the fixtures above.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import gguf
import psutil
import pytest

from harness import modelgen
from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.errors import ServerExitedError
from harness.facts.build import Backend, Capabilities
from harness.facts.gpu import GpuInfo
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.build_support import ensure_offered
from harness.planning.drafter import BrokenDrafters
from harness.planning.kv import kv_bytes_per_token, layout_from_facts
from harness.planning.ladder import Rung, Step, ladder_for, next_rung
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.offload import (
    COMPUTE_RESERVE_BYTES,
    DEFAULT_MARGIN_BYTES,
    OVERRIDE_FLAGS,
    OffloadKind,
    all_layers,
)
from harness.planning.planned_share import PlannedShare, non_layer_bytes, planned_gpu_share
from harness.planning.retry import starting_rung
from harness.probes.devices import Device
from harness.probes.gguf_facts import read_model_facts
from harness.runners.readiness import wait_until_ready
from harness.runners.subprocess_runner import SubprocessRunner, SubprocessServer
from harness.supervise.oom_injector import make_oom_launcher, starts_seen
from harness.supervise.supervisor import (
    AttemptOutcome,
    LaunchFailedError,
    LaunchSupervisor,
    SupervisedLaunch,
)
from harness.verdicts.failure import FailureClass, classify_start_failure
from harness.verdicts.log_blocks import BlockRole
from harness.verdicts.residency import (
    HALF_PRINTED_UNIT_BYTES,
    Place,
    ShareOutcome,
    place_of,
    residency_verdict,
    tolerance_bytes,
)

pytestmark = pytest.mark.server

MIB = 1024 * 1024
#: Each fixture tensor stands for one SCALE times its size (196608 B of experts → 384 MiB).
SCALE = 2048
CTX = 4096
#: A GPU no card config names: no card settings or headroom, only its VRAM.
TEST_GPU = "Harness Test GPU"
#: VRAM under autotune's smallest bucket: no card config is borrowed (planning/autotune.py).
TINY_BUCKET_MIB = 8 * 1024
#: -lv 5 (DEBUG) lists every tensor an override moved.
DEBUG_VERBOSITY = 5
#: llama.cpp's override patterns (common/common.h): LLM_FFN_EXPS_REGEX is what --n-cpu-moe
#: and --cpu-moe move, LLM_FFN_DENSE_REGEX what --n-cpu-ffn moves.
EXPERTS = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
DENSE_FFN = re.compile(r"\.ffn_(up|down|gate)\.")
_BLOCK = re.compile(r"^blk\.(\d+)\.")
#: The DEBUG line src/llama-model.cpp writes for each tensor an override moved. The
#: buffer is ``CPU`` on the CPU build and the backend's pinned host buffer on a GPU one:
#: ``CUDA_Host`` on the CUDA build (measured on an H200, 2026-12-04).
_OVERRIDDEN = re.compile(r"tensor (\S+) \([^)]*\) buffer type overridden to (\S+)")

#: fixture → (the offload kind its plan must take, what that kind moves).
KINDS = {
    "moe": (OffloadKind.N_CPU_MOE, EXPERTS),
    "dense": (OffloadKind.N_CPU_FFN, DENSE_FFN),
}
#: fixture → the switches its plan and ladder are about. A build without them gets
#: another plan (planning/offload.py), which these tests are not about: they skip with
#: "not supported by this build: FLAG" (fail under --harness-require-features).
NEEDS = {
    "moe": (OVERRIDE_FLAGS[OffloadKind.N_CPU_MOE], OVERRIDE_FLAGS[OffloadKind.CPU_MOE]),
    "dense": (OVERRIDE_FLAGS[OffloadKind.N_CPU_FFN],),
}


def _scaled(facts: ModelFacts) -> ModelFacts:
    layers = tuple(LayerBytes(layer.index, layer.expert * SCALE, layer.dense_ffn * SCALE,
                              layer.other * SCALE) for layer in facts.layer_bytes)
    return replace(facts, layer_bytes=layers, non_layer_bytes=facts.non_layer_bytes * SCALE,
                   file_size=facts.file_size * SCALE)


def _plan(path: Path, facts: ModelFacts, vram_mib: int, build: BuildUnderTest) -> LaunchPlan:
    return plan_launch(PlanRequest(
        model_path=path, model=facts, gpu=GpuInfo(TEST_GPU, vram_mib), configs=(),
        build_key=build.key, per_call={"ctx_size": CTX, "parallel": 1},
        capabilities=build.info.capabilities if build.info else Capabilities(),
        release=build.release))


def _vram_for_the_last_block(path: Path, facts: ModelFacts, build: BuildUnderTest) -> int:
    """MiB of VRAM that hold the residue, the reserves and 1.5 of the last block's share.

    Under ``TINY_BUCKET_MIB`` (asserted), so no card's settings or headroom take part.
    """
    kv = _plan(path, facts, TINY_BUCKET_MIB, build).kv
    assert kv is not None
    last = facts.layer_bytes[-1]
    moved = last.expert if facts.is_moe else last.dense_ffn
    residue = facts.non_layer_bytes + sum(layer.total for layer in facts.layer_bytes) - sum(
        (layer.expert if facts.is_moe else layer.dense_ffn) for layer in facts.layer_bytes)
    need = DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES + kv.total_bytes + residue
    vram_mib = math.ceil((need + moved * 3 // 2) / MIB)
    assert vram_mib < TINY_BUCKET_MIB, "SCALE makes the model too large for a bucketless GPU"
    return vram_mib


@pytest.fixture(params=list(KINDS), ids=[f"{name}" for name in KINDS])
def planned(request: pytest.FixtureRequest, fixture_set: modelgen.FixtureSet,
            harness_build: BuildUnderTest) -> tuple[str, ModelFacts, LaunchPlan]:
    """A fixture's plan on a GPU that holds only its last block's experts / dense FFN."""
    name: str = request.param
    ensure_offered(harness_build.info.capabilities if harness_build.info else Capabilities(),
                   *NEEDS[name])
    path = fixture_set.model(name)
    facts = _scaled(read_model_facts(path))
    plan = _plan(path, facts, _vram_for_the_last_block(path, facts, harness_build),
                 harness_build)
    spec = replace(plan.spec, log_verbosity=DEBUG_VERBOSITY)
    return name, facts, replace(plan, spec=spec)


@pytest.fixture
def servers() -> Iterator[list[SubprocessServer]]:
    started: list[SubprocessServer] = []
    yield started
    for server in started:
        server.stop()


def _supervise(runner: SubprocessRunner, build: BuildUnderTest, facts: ModelFacts,
               plan: LaunchPlan, servers: list[SubprocessServer],
               ) -> SupervisedLaunch[SubprocessServer]:
    launch = LaunchSupervisor(runner, build.key, BrokenDrafters(), facts).launch(plan)
    servers.append(launch.server)
    return launch


def _tensors_moved_by(path: Path, pattern: re.Pattern[str], blocks: int) -> set[str]:
    """The tensors of blocks 0..blocks-1 that ``pattern`` (an override regex) names."""
    names = set()
    for tensor in gguf.GGUFReader(path).tensors:
        block = _BLOCK.match(tensor.name)
        if block and int(block.group(1)) < blocks and pattern.search(tensor.name):
            names.add(str(tensor.name))
    return names


def _moved(server: SubprocessServer) -> set[str]:
    """The tensors the server's override lines put in host memory."""
    return {tensor for tensor, buffer in _OVERRIDDEN.findall(server.log_text())
            if place_of(buffer) is Place.HOST}


def _serves(server: SubprocessServer) -> None:
    with ServerClient(server.base_url) as client:
        assert client.completion("Once upon a time", n_predict=4).tokens_predicted >= 1


def test_the_plan_moves_exactly_its_first_blocks_and_serves(
        planned: tuple[str, ModelFacts, LaunchPlan], server_runner: SubprocessRunner,
        harness_build: BuildUnderTest, servers: list[SubprocessServer]) -> None:
    name, facts, plan = planned
    kind, pattern = KINDS[name]
    assert plan.offload is not None
    assert (plan.offload.kind, plan.offload.n) == (kind, 1), plan.offload.reason
    n = 1
    assert plan.spec.n_gpu_layers == all_layers(facts.block_count)
    assert (plan.spec.n_cpu_moe, plan.spec.n_cpu_ffn) == (
        (n, None) if kind is OffloadKind.N_CPU_MOE else (None, n))

    launch = _supervise(server_runner, harness_build, facts, plan, servers)
    assert [a.outcome for a in launch.attempts] == [AttemptOutcome.SERVED]
    planned_names = _tensors_moved_by(plan.spec.model, pattern, n)
    assert planned_names, f"the {name} fixture has no such tensors in block 0"
    assert _moved(launch.server) == planned_names
    _serves(launch.server)


#: fixture → how many OOM starts the injector makes before the real server starts.
LADDER_FAILS = {"moe": 3, "dense": 2}


def test_the_ladder_steps_one_rung_per_oom_and_stops_at_the_first_that_starts(
        planned: tuple[str, ModelFacts, LaunchPlan], llama_server_binary: Path,
        harness_build: BuildUnderTest, servers: list[SubprocessServer], tmp_path: Path) -> None:
    name, facts, plan = planned
    assert plan.offload is not None
    fails = LADDER_FAILS[name]
    ladder = ladder_for(facts, plan.offload, CTX)
    launcher = make_oom_launcher(llama_server_binary, tmp_path / "oom", fail_first=fails)
    runner = SubprocessRunner(launcher, tmp_path / "logs", ready_timeout_s=60)

    launch = _supervise(runner, harness_build, facts, plan, servers)
    rungs = [attempt.rung for attempt in launch.attempts]
    assert _steps(rungs) == _steps(list(ladder[:fails + 1]))
    assert [r.flags for r in rungs] == [r.flags for r in ladder[:fails + 1]]
    for attempt in launch.attempts[:-1]:
        assert attempt.failure is not None
        assert attempt.failure.kind is FailureClass.OUT_OF_MEMORY
        assert attempt.action.startswith("stepped down the offload ladder")
    assert launch.attempts[-1].outcome is AttemptOutcome.SERVED
    assert starts_seen(launcher) == fails + 1
    # The rung it stopped on is what the server did: moe retreated to --cpu-moe (every
    # block's experts), dense to --n-cpu-ffn over every block.
    _, pattern = KINDS[name]
    assert _moved(launch.server) == _tensors_moved_by(plan.spec.model, pattern,
                                                      facts.block_count)
    _serves(launch.server)


def test_an_exhausted_ladder_fails_with_every_rung_tried(
        planned: tuple[str, ModelFacts, LaunchPlan], llama_server_binary: Path,
        harness_build: BuildUnderTest, servers: list[SubprocessServer], tmp_path: Path) -> None:
    _, facts, plan = planned
    assert plan.offload is not None
    ladder = ladder_for(facts, plan.offload, CTX)
    launcher = make_oom_launcher(llama_server_binary, tmp_path / "oom",
                                 fail_first=len(ladder) + 2)
    runner = SubprocessRunner(launcher, tmp_path / "logs", ready_timeout_s=60)
    with pytest.raises(LaunchFailedError) as raised:
        _supervise(runner, harness_build, facts, plan, servers)
    error = raised.value
    assert error.failure.kind is FailureClass.OUT_OF_MEMORY
    assert [a.rung for a in error.attempts] == list(ladder)
    assert starts_seen(launcher) == len(ladder), "nothing is started after the last rung"
    message = str(error)
    tried = message.index("tried: ")
    positions = [message.index(f"{i}. {rung.label}", tried) for i, rung in enumerate(ladder, 1)]
    assert positions == sorted(positions)
    assert "nothing safer left" in error.reason


def _steps(rungs: list[Rung]) -> list[Step]:
    return [rung.step for rung in rungs]


# --- a real out-of-memory start, on GPU runners -------------------------------------------

GPU_OOM_WORDS = {
    Backend.CUDA: "cudaMalloc failed: out of memory",
    Backend.ROCM: "cudaMalloc failed: out of memory",
    Backend.VULKAN: "Device memory allocation of size",
}


def _kv_over_device(facts: ModelFacts, device: Device, factor: float = 1.5) -> tuple[int, int]:
    """A context whose f32 KV cache is ``factor`` times the device's free memory, and its
    bytes."""
    per_token = kv_bytes_per_token(layout_from_facts(facts), "f32", "f32")
    ctx = math.ceil(device.free_mib * MIB * factor / per_token / 256) * 256
    if ctx >= 2**31:
        pytest.skip(f"{device.name} has {device.free_mib} MiB free: no context under 2^31 "
                    "tokens of this fixture's KV cache exceeds it")
    return ctx, ctx * per_token


def _oom_spec(model: Path, ctx: int) -> LaunchSpec:
    # --fit is on by default and would shrink the context to fit (docs/design.md): off, the
    # server asks for the whole KV buffer on the device and fails the start.
    return LaunchSpec(model=model, fit="off", n_gpu_layers=99, ctx_size=ctx, parallel=1,
                      cache_type_k="f32", cache_type_v="f32")


def _device(devices: tuple[Device, ...], backend: Backend) -> Device:
    return next(d for d in devices if d.backend is backend)


@pytest.mark.parametrize("backend", [
    pytest.param(Backend.CUDA, marks=pytest.mark.gpu("cuda"), id="cuda"),
    pytest.param(Backend.ROCM, marks=pytest.mark.gpu("rocm"), id="rocm"),
    pytest.param(Backend.VULKAN, marks=pytest.mark.gpu("vulkan"), id="vulkan"),
])
def test_a_real_out_of_memory_start_is_classified(
        backend: Backend, server_runner: SubprocessRunner, build_devices: tuple[Device, ...],
        fixture_set: modelgen.FixtureSet) -> None:
    model = fixture_set.model("dense")
    ctx, _ = _kv_over_device(read_model_facts(model), _device(build_devices, backend))
    server = server_runner.launch(_oom_spec(model, ctx))
    try:
        with pytest.raises(ServerExitedError):
            wait_until_ready(server, server_runner.conditions, server_runner.ready_timeout_s)
    finally:
        server.stop()
    failure = classify_start_failure(server.exit_code(), server.log_text(), timed_out=False)
    assert failure.kind is FailureClass.OUT_OF_MEMORY, failure
    assert failure.exit_code == 1
    assert GPU_OOM_WORDS[backend] in server.log_text()


@pytest.mark.gpu("cuda")
def test_the_ladder_recovers_from_a_real_kv_out_of_memory(
        server_runner: SubprocessRunner, build_devices: tuple[Device, ...],
        fixture_set: modelgen.FixtureSet, harness_build: BuildUnderTest,
        servers: list[SubprocessServer]) -> None:
    """The KV cache does not fit the GPU; the ladder retreats until a start serves.

    The KV cache is a tenth over the GPU's free memory. Where system RAM holds it, the
    ``--no-kv-offload`` rung serves; where it does not (an H200's 141 GiB against a
    128 GiB host), that rung's start fails too — the host buffer cannot be allocated,
    ``failed to allocate CPU buffer``, an out-of-memory start like the GPU's — and the
    ladder goes on to halve the context, which must then serve. Either way every failed
    start is an out-of-memory one and the rungs come in the ladder's order.
    """
    model = fixture_set.model("dense")
    facts = read_model_facts(model)
    ctx, kv_bytes = _kv_over_device(facts, _device(build_devices, Backend.CUDA), factor=1.1)
    host_holds_kv = kv_bytes * 1.2 < psutil.virtual_memory().available
    spec = _oom_spec(model, ctx)
    launch = LaunchSupervisor(server_runner, harness_build.key, BrokenDrafters(),
                              facts).launch_spec(spec)
    servers.append(launch.server)
    *failed, served = launch.attempts
    assert failed, "the first start must run out of GPU memory"
    for attempt in failed:
        assert attempt.failure is not None
        assert attempt.failure.kind is FailureClass.OUT_OF_MEMORY, attempt.failure
    assert served.outcome is AttemptOutcome.SERVED
    # One rung per OOM from the launch as given: -ngl 99, then the layer count left to
    # the server, then the KV cache in system RAM, then (a host too small for it) half
    # the context at a time.
    expected = [starting_rung(facts, None, spec)]
    while len(expected) < len(launch.attempts):
        following = next_rung(expected[-1])
        assert following is not None
        expected.append(following)
    assert [a.rung for a in launch.attempts] == expected
    if host_holds_kv:
        assert served.rung.step in (Step.LAYERS_TO_ENGINE, Step.KV_TO_CPU)
    else:
        assert served.rung.step is Step.SMALLER_CONTEXT, (
            f"the host cannot hold the {kv_bytes / 2**30:.0f} GiB KV cache, so only a "
            f"smaller context can serve; served on {served.rung.label}")
        assert not served.rung.kv_offload
    _serves(launch.server)


# --- the planned share against the buffers (harness/verdicts/residency.py) -----------------
#
# The plan's facts are scaled (``SCALE``) to make the planner split; the server loads the
# real fixture, so its share is planned from the fixture's own facts with the plan's flags.


def _real_share(plan: LaunchPlan, *, gpu_device: bool) -> PlannedShare:
    reader = gguf.GGUFReader(plan.spec.model)
    facts = read_model_facts(plan.spec.model)
    split = non_layer_bytes(((str(t.name), int(t.n_bytes)) for t in reader.tensors),
                            facts.block_count)
    return planned_gpu_share(facts, plan.spec, split, gpu_device=gpu_device)


def _tensor_bytes(path: Path, names: set[str]) -> int:
    return sum(int(t.n_bytes) for t in gguf.GGUFReader(path).tensors if str(t.name) in names)


def test_on_the_cpu_build_the_planned_overrides_and_every_weight_are_in_host_memory(
        planned: tuple[str, ModelFacts, LaunchPlan], server_runner: SubprocessRunner,
        harness_build: BuildUnderTest, servers: list[SubprocessServer]) -> None:
    if harness_build.backend is not Backend.CPU:
        pytest.skip(f"the build under test is a {harness_build.backend.value} build; "
                    "the GPU variant below checks it")
    name, _, plan = planned
    launch = _supervise(server_runner, harness_build, read_model_facts(plan.spec.model),
                        plan, servers)
    log = launch.server.log_text()
    on_cpu = _real_share(plan, gpu_device=False)
    verdict = residency_verdict(log, {BlockRole.TARGET: on_cpu})
    assert verdict.warnings == (), verdict.warnings
    target = verdict.block(BlockRole.TARGET)
    assert target is not None
    assert target.processor == "100% CPU"
    assert target.weights_gpu_mib == 0
    held = target.weights_host_mib * MIB
    assert held >= on_cpu.total_bytes - HALF_PRINTED_UNIT_BYTES
    # What a GPU build would keep in host memory for the same flags: the tensors the
    # server's own -lv 5 override lines name, besides the input layer. On this build they
    # sit there with everything else; only a GPU build can show them apart from the rest
    # (the GPU variant below: the device buffer holds all but them).
    on_gpu = _real_share(plan, gpu_device=True)
    moved = _moved(launch.server)
    assert moved, f"the {name} plan's override moved nothing"
    assert on_gpu.override_host_bytes == _tensor_bytes(plan.spec.model, moved) > 0
    assert held >= on_gpu.host_bytes - HALF_PRINTED_UNIT_BYTES


@pytest.mark.parametrize("backend", [
    pytest.param(Backend.CUDA, marks=pytest.mark.gpu("cuda"), id="cuda"),
    pytest.param(Backend.ROCM, marks=pytest.mark.gpu("rocm"), id="rocm"),
    pytest.param(Backend.VULKAN, marks=pytest.mark.gpu("vulkan"), id="vulkan"),
])
def test_on_a_gpu_the_planned_overrides_stay_in_host_memory(
        backend: Backend, planned: tuple[str, ModelFacts, LaunchPlan],
        server_runner: SubprocessRunner, harness_build: BuildUnderTest,
        servers: list[SubprocessServer]) -> None:
    name, _, plan = planned
    launch = _supervise(server_runner, harness_build, read_model_facts(plan.spec.model),
                        plan, servers)
    share = _real_share(plan, gpu_device=True)
    assert share.override_host_bytes > 0, f"the {name} plan keeps nothing on the CPU"
    verdict = residency_verdict(launch.server.log_text(), {BlockRole.TARGET: share})
    check = verdict.check(BlockRole.TARGET)
    assert check is not None
    # AS_PLANNED rules out both ways off: the kept tensors on the GPU (MORE_ON_GPU, the
    # fixture's block-0 experts / FFN are larger than the tolerance) and layers left on
    # the host (MORE_ON_HOST).
    assert share.override_host_bytes > tolerance_bytes(share, 1)
    assert check.outcome is ShareOutcome.AS_PLANNED, check.message
    assert verdict.warnings == ()
    # The host figure spans the kept tensors (CPU_Mapped maps from token_embd to the last
    # of them), so it holds at least the input layer and what the overrides kept.
    assert check.observed_host_mib * MIB >= share.host_bytes - HALF_PRINTED_UNIT_BYTES
    _serves(launch.server)
