"""Properties of the offload planner and the degrade ladders, over generated models.

- more VRAM never gives a more aggressive plan, nor more blocks or bytes in RAM;
- more reserved bytes (KV, drafter) never give a less aggressive plan;
- a plan that pins ``-ngl`` keeps what it places on the GPU within the budget;
- plans and ladders are deterministic;
- every ladder is finite and each step is strictly safer than the one before;
- on a build that lacks override switches, neither the plan nor any rung of its ladder
  takes their kinds, a substitute still keeps its GPU share within the budget, and more
  VRAM still never gives a more aggressive plan.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.ladder import end_reason, ladder_for, next_rung
from harness.planning.offload import (
    COMPUTE_RESERVE_BYTES,
    DEFAULT_MARGIN_BYTES,
    MIB,
    OVERRIDE_FLAGS,
    OffloadKind,
    OffloadPlan,
    plan_offload,
)

LAYER_MAX = 4096 * MIB
VRAM_MAX = 64 * 1024 * MIB
#: The planner's fixed reserves beside KV and drafter (reference 003, docs/references.md:
#: 1 GiB + 512 MiB).
FIXED_RESERVES = DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES


@st.composite
def models(draw: st.DrawFn) -> ModelFacts:
    """MoE or dense, with or without exact per-layer sizes, 1 to 12 blocks."""
    is_moe = draw(st.booleans())
    blocks = draw(st.integers(1, 12))
    # Hypothesis favours small integers; the per-mille spread gives realistic layer sizes too.
    spread = st.integers(0, 1000).map(lambda mille: LAYER_MAX * mille // 1000)
    sizes = st.one_of(spread, spread, st.integers(0, LAYER_MAX))
    layers: tuple[LayerBytes, ...] = ()
    if draw(st.booleans()):
        layers = tuple(
            # A MoE block's dense FFN is its shared experts: small beside the routed ones.
            LayerBytes(i, draw(sizes) if is_moe else 0,
                       draw(st.integers(0, 512 * MIB) if is_moe else sizes),
                       draw(st.integers(0, 512 * MIB)))
            for i in range(blocks))
    return ModelFacts(
        path="generated.gguf", file_size=blocks * draw(sizes),
        architecture="test", block_count=blocks, context_length=4096, embedding_length=64,
        head_count=4, head_count_kv=(2,) * blocks, key_length=16, value_length=16,
        vocab_size=269, expert_count=8 if is_moe else 0, expert_used_count=2 if is_moe else 0,
        layer_bytes=layers, non_layer_bytes=draw(st.integers(0, 2048 * MIB)))


@dataclass(frozen=True)
class Scenario:
    """A model, two VRAM budgets, and the other planner inputs."""

    model: ModelFacts
    vram: int
    other_vram: int
    kv: int
    ram: int
    drafter: int

    def plan(self, vram: int | None = None, kv: int = 0, drafter: int = 0) -> OffloadPlan:
        return plan_offload(self.model, self.vram if vram is None else vram, self.kv + kv,
                            self.ram, self.drafter + drafter)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """Budgets mostly between "only the reserves" and "everything fits", where the rules
    differ; sometimes anywhere, including no GPU at all."""
    model = draw(models())
    kv = draw(st.integers(0, 2048 * MIB))
    drafter = draw(st.sampled_from([0, 0, 300 * MIB, 2048 * MIB]))
    layers = model.layer_bytes
    movable = sum(layer.expert if model.is_moe else layer.dense_ffn for layer in layers)
    weights = model.non_layer_bytes + sum(layer.total for layer in layers)
    residue = weights - movable if layers else 0
    reserves = FIXED_RESERVES + kv + drafter
    top = reserves + (weights if layers else model.file_size)
    low = reserves + residue - max(64 * MIB, movable // 8)
    high = top + (top - low) // 4 + MIB
    # Spread by per-mille: hypothesis favours a range's ends, and the low end is one rule.
    interesting = st.integers(0, 1000).map(lambda mille: low + (high - low) * mille // 1000)
    vram = st.one_of(interesting, interesting, interesting, st.integers(-MIB, VRAM_MAX))
    ram = st.one_of(st.just(VRAM_MAX), st.integers(0, weights + 2 * DEFAULT_MARGIN_BYTES))
    return Scenario(model, draw(vram), draw(vram), kv, draw(ram), drafter)


def assert_no_more_aggressive(looser: OffloadPlan, tighter: OffloadPlan) -> None:
    """``looser`` (more room) moves no more off the GPU than ``tighter``."""
    assert looser.rank <= tighter.rank, (looser.reason, tighter.reason)
    if OffloadKind.ENGINE_FIT not in (looser.kind, tighter.kind):
        assert looser.cpu_layers <= tighter.cpu_layers, (looser.reason, tighter.reason)
    if looser.ram_bytes is not None and tighter.ram_bytes is not None:
        assert looser.ram_bytes <= tighter.ram_bytes, (looser.reason, tighter.reason)


@settings(max_examples=400)
@given(scenarios())
def test_more_vram_never_gives_a_more_aggressive_plan(case: Scenario) -> None:
    low, high = sorted((case.vram, case.other_vram))
    assert_no_more_aggressive(case.plan(high), case.plan(low))


@settings(max_examples=400)
@given(scenarios(), st.integers(0, 8192 * MIB))
def test_more_reserved_bytes_never_give_a_less_aggressive_plan(case: Scenario,
                                                                extra: int) -> None:
    base = case.plan()
    assert_no_more_aggressive(base, case.plan(kv=extra))
    assert_no_more_aggressive(base, case.plan(drafter=extra))


@given(scenarios())
def test_a_plan_keeps_its_gpu_share_within_the_budget(case: Scenario) -> None:
    result, model, vram_bytes = case.plan(), case.model, case.vram
    if (result.gpu_layers is not None and result.exact) or result.kind is OffloadKind.NONE:
        assert result.gpu_bytes is not None
        assert result.gpu_bytes + result.reserve_bytes <= vram_bytes
    if result.kind in (OffloadKind.N_CPU_MOE, OffloadKind.N_CPU_FFN):
        assert result.n is not None
        assert 1 <= result.n <= model.block_count
        assert result.flags[:2] == (f"--{result.kind.value.replace('_', '-')}", str(result.n))
    if result.kind is OffloadKind.N_CPU_MOE:
        assert result.n is not None
        assert result.n < model.block_count
    if result.exact and result.gpu_bytes is not None and result.ram_bytes is not None:
        weights = model.non_layer_bytes + sum(layer.total for layer in model.layer_bytes)
        assert result.gpu_bytes + result.ram_bytes == weights


@given(scenarios())
def test_plans_and_ladders_are_deterministic(case: Scenario) -> None:
    first = case.plan()
    assert first == case.plan()
    assert ladder_for(case.model, first, 8192) == ladder_for(case.model, first, 8192)


@settings(max_examples=300)
@given(scenarios(), st.none() | st.integers(1, 1 << 20), st.integers(1, 1 << 16))
def test_every_ladder_ends_and_each_step_is_strictly_safer(
        case: Scenario, ctx: int | None, min_ctx: int) -> None:
    rungs = ladder_for(case.model, case.plan(), ctx, min_ctx)
    # Offload: at most two steps; KV: one; context: one per halving down to the floor.
    halvings = 0 if ctx is None or ctx < min_ctx else int(math.log2(ctx // min_ctx))
    assert len(rungs) <= 1 + 2 + 1 + halvings
    for before, after in itertools.pairwise(rungs):
        assert after.safety.strictly_safer_than(before.safety), (before, after)
    assert len(set(rungs)) == len(rungs)
    assert next_rung(rungs[-1], min_ctx) is None
    assert end_reason(rungs[-1], min_ctx) is not None
    assert all(end_reason(rung, min_ctx) is None for rung in rungs[:-1])
    assert "--no-kv-offload" in rungs[-1].flags
    assert rungs[-1].gpu_layers is None


#: What a build's ``--help`` may lack: any set of the override switches.
lacking = st.sets(st.sampled_from(list(OVERRIDE_FLAGS))).map(frozenset)


@settings(max_examples=400)
@given(scenarios(), lacking)
def test_a_build_without_a_switch_never_gets_its_kind(
        case: Scenario, unavailable: frozenset[OffloadKind]) -> None:
    def plan(vram: int) -> OffloadPlan:
        return plan_offload(case.model, vram, case.kv, case.ram, case.drafter,
                            unavailable=unavailable)

    result = plan(case.vram)
    assert result.kind not in unavailable, result.reason
    assert result.unavailable == unavailable
    assert (result.wanted is None) == (result == replace(
        plan_offload(case.model, case.vram, case.kv, case.ram, case.drafter),
        unavailable=unavailable)), "a plan says what it wanted exactly when it changed"
    for rung in ladder_for(case.model, result, 8192):
        assert rung.kind not in unavailable, rung.label
    if result.gpu_layers is not None and result.exact:
        assert result.gpu_bytes is not None
        assert result.gpu_bytes + result.reserve_bytes <= case.vram, result.reason
    low, high = sorted((case.vram, case.other_vram))
    assert plan(high).rank <= plan(low).rank
