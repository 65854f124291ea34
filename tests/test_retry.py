"""The retry launches (``harness/planning/retry.py``): without the drafter, on a safer rung.

Ladders come from the real offload planner on four 100 MiB blocks, as in test_ladder.py;
every rung applied to a launch must put exactly that rung's flags on the command line.
"""

from __future__ import annotations

from dataclasses import fields, replace
from pathlib import Path

import pytest

from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.ladder import Step, ladder_for, next_rung
from harness.planning.launch import LaunchSpec
from harness.planning.offload import (
    COMPUTE_RESERVE_BYTES,
    DEFAULT_MARGIN_BYTES,
    MIB,
    OffloadKind,
    OffloadPlan,
    plan_offload,
)
from harness.planning.retry import apply_rung, starting_rung, without_drafter

RESERVES = DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES
MODEL = Path("/models/m.gguf")
#: How llama-server spells what a Rung's ``flags`` abbreviate (common/arg.cpp aliases).
_ALIASES = {"--n-gpu-layers": "-ngl"}
_OFFLOAD_FLAGS = {"-ngl", "--n-cpu-moe", "--n-cpu-ffn", "--cpu-moe", "--no-kv-offload",
                  "--kv-offload"}
_TAKES_VALUE = {"-ngl", "--n-cpu-moe", "--n-cpu-ffn"}


def four_blocks(moe: bool) -> ModelFacts:
    layers = tuple(LayerBytes(i, 100 * MIB if moe else 0, 0 if moe else 100 * MIB, 10 * MIB)
                   for i in range(4))
    return ModelFacts(
        path=str(MODEL), file_size=540 * MIB, architecture="test", block_count=4,
        context_length=8192, embedding_length=64, head_count=4, head_count_kv=(2,) * 4,
        key_length=16, value_length=16, vocab_size=269, expert_count=8 if moe else 0,
        expert_used_count=2 if moe else 0, layer_bytes=layers, non_layer_bytes=100 * MIB)


MOE = four_blocks(moe=True)
DENSE = four_blocks(moe=False)


def planned_spec(plan: OffloadPlan, **launch: object) -> LaunchSpec:
    """The spec plan_launch makes from ``plan`` (its fields, -ngl when pinned)."""
    spec = LaunchSpec(model=MODEL, n_gpu_layers=plan.gpu_layers, **launch)  # type: ignore[arg-type]
    if plan.kind is OffloadKind.N_CPU_MOE:
        return replace(spec, n_cpu_moe=plan.n)
    if plan.kind is OffloadKind.CPU_MOE:
        return replace(spec, cpu_moe=True)
    if plan.kind is OffloadKind.N_CPU_FFN:
        return replace(spec, n_cpu_ffn=plan.n)
    return spec


def offload_args(spec: LaunchSpec) -> tuple[str, ...]:
    """The offload and KV-placement flags of ``spec``'s argv, spelled as Rung.flags are."""
    argv = iter(spec.to_argv("llama-server", "127.0.0.1", 0)[1:])
    found: list[tuple[str, ...]] = []
    for arg in argv:
        flag = _ALIASES.get(arg, arg)
        if flag in _OFFLOAD_FLAGS:
            found.append((flag, next(argv)) if flag in _TAKES_VALUE else (flag,))
    return tuple(part for item in sorted(found) for part in item)


def canonical(flags: tuple[str, ...]) -> tuple[str, ...]:
    items: list[tuple[str, ...]] = []
    args = iter(flags)
    for flag in args:
        items.append((flag, next(args)) if flag in _TAKES_VALUE else (flag,))
    return tuple(part for item in sorted(items) for part in item)


LADDERS = {
    "moe-n-cpu-moe": (MOE, 340, OffloadKind.N_CPU_MOE),
    "moe-cpu-moe-pinned": (MOE, 200, OffloadKind.CPU_MOE),
    "moe-cpu-moe-unpinned": (MOE, 100, OffloadKind.CPU_MOE),
    "moe-fits": (MOE, 1000, OffloadKind.NONE),
    "dense-n-cpu-ffn": (DENSE, 340, OffloadKind.N_CPU_FFN),
    "dense-fits": (DENSE, 1000, OffloadKind.NONE),
    "dense-engine-fit": (DENSE, 100, OffloadKind.ENGINE_FIT),
}


@pytest.mark.parametrize(("model", "vram", "kind"), LADDERS.values(), ids=LADDERS.keys())
def test_every_rung_puts_exactly_its_flags_on_the_command_line(
        model: ModelFacts, vram: int, kind: OffloadKind) -> None:
    plan = plan_offload(model, RESERVES + vram * MIB, 0, 1 << 50)
    assert plan.kind is kind, plan.reason
    spec = planned_spec(plan, ctx_size=8192, parallel=2, extra_args=("--metrics",))
    rungs = ladder_for(model, plan, ctx_size=8192)
    assert len(rungs) > 1
    for rung in rungs:
        moved = apply_rung(spec, rung)
        assert offload_args(moved) == canonical(rung.flags), rung.label
        assert moved.ctx_size == rung.ctx_size
        # Nothing else about the launch changes.
        assert (moved.model, moved.parallel, moved.extra_args) == (MODEL, 2, ("--metrics",))


def test_a_rung_clears_the_previous_offload_kind() -> None:
    spec = LaunchSpec(model=MODEL, n_cpu_moe=3, n_gpu_layers=5, n_cpu_ffn=2)
    rung = next_rung(starting_rung(MOE, None, replace(spec, n_cpu_ffn=None)))
    assert rung is not None
    assert rung.step is Step.ALL_EXPERTS_TO_CPU
    moved = apply_rung(spec, rung)
    assert (moved.cpu_moe, moved.n_cpu_moe, moved.n_cpu_ffn, moved.n_gpu_layers) == (
        True, None, None, 5)


def test_offload_flags_in_extra_args_give_way_to_the_rung() -> None:
    spec = LaunchSpec(model=MODEL, extra_args=("--n-cpu-moe", "1", "-ngl", "5", "--metrics",
                                               "-nkvo", "--cpu-moe", "--threads", "2"))
    rung = starting_rung(MOE, None, LaunchSpec(model=MODEL, n_cpu_moe=1, n_gpu_layers=5))
    moved = apply_rung(spec, rung)
    assert moved.extra_args == ("--metrics", "--threads", "2")
    assert (moved.n_cpu_moe, moved.n_gpu_layers) == (1, 5)


@pytest.mark.parametrize("kv_offload", [None, True, False], ids=["default", "on", "off"])
def test_the_starting_rung_is_the_launch_itself(kv_offload: bool | None) -> None:
    plan = plan_offload(MOE, RESERVES + 340 * MIB, 0, 1 << 50)
    spec = planned_spec(plan, ctx_size=4096, kv_offload=kv_offload)
    rung = starting_rung(MOE, plan, spec)
    assert rung.step is Step.PLANNED
    assert apply_rung(spec, rung) == spec
    assert rung.kv_offload is (kv_offload is not False)


def test_without_a_plan_the_specs_own_pin_starts_the_ladder() -> None:
    # A card's -ngl 999 with no offload plan: the ladder must know to unpin it.
    spec = LaunchSpec(model=MODEL, n_gpu_layers=999, ctx_size=4096)
    rung = starting_rung(DENSE, None, spec)
    assert (rung.kind, rung.gpu_layers, rung.label) == (
        OffloadKind.NONE, 999, "as planned: -ngl 999")
    assert apply_rung(spec, rung) == spec
    following = next_rung(rung)
    assert following is not None
    assert following.step is Step.LAYERS_TO_ENGINE
    assert apply_rung(spec, following).n_gpu_layers is None


def test_without_drafter_drops_only_speculative_decoding() -> None:
    spec = LaunchSpec(model=MODEL, ctx_size=2048, parallel=1, spec_type="draft-simple",
                      drafter=Path("/models/d.gguf"), spec_draft_n_min=2, spec_draft_n_max=8,
                      spec_draft_p_min=0.5, n_cpu_moe=1, extra_args=("--metrics",))
    bare = without_drafter(spec)
    assert (bare.spec_type, bare.drafter, bare.spec_draft_n_min, bare.spec_draft_n_max,
            bare.spec_draft_p_min) == (None, None, None, None, None)
    speculative = {"spec_type", "drafter", "spec_draft_n_min", "spec_draft_n_max",
                   "spec_draft_p_min"}
    for field in fields(LaunchSpec):
        if field.name not in speculative:
            assert getattr(bare, field.name) == getattr(spec, field.name), field.name
    argv = bare.to_argv("llama-server", "127.0.0.1", 0)
    assert not [a for a in argv if a.startswith("--spec")]
