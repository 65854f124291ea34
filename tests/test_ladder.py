"""The out-of-memory degrade ladders (``harness/planning/ladder.py``), MoE and dense.

Plans come from the real planner on four 100 MiB blocks (residue 140 MiB), with the
VRAM budget chosen to land on each plan kind.
"""

from __future__ import annotations

import itertools

import pytest

from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.ladder import (
    DEFAULT_MIN_CTX_SIZE,
    Rung,
    Step,
    end_reason,
    first_rung,
    ladder_for,
    next_rung,
)
from harness.planning.offload import (
    COMPUTE_RESERVE_BYTES,
    DEFAULT_MARGIN_BYTES,
    MIB,
    OffloadKind,
    OffloadPlan,
    plan_offload,
)

RESERVES = DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES


def four_blocks(moe: bool) -> ModelFacts:
    layers = tuple(LayerBytes(i, 100 * MIB if moe else 0, 0 if moe else 100 * MIB, 10 * MIB)
                   for i in range(4))
    return ModelFacts(
        path="model.gguf", file_size=540 * MIB, architecture="test", block_count=4,
        context_length=8192, embedding_length=64, head_count=4, head_count_kv=(2,) * 4,
        key_length=16, value_length=16, vocab_size=269, expert_count=8 if moe else 0,
        expert_used_count=2 if moe else 0, layer_bytes=layers, non_layer_bytes=100 * MIB)


MOE = four_blocks(moe=True)
DENSE = four_blocks(moe=False)


def plan_for(model: ModelFacts, vram_over_reserves_mib: int) -> OffloadPlan:
    return plan_offload(model, RESERVES + vram_over_reserves_mib * MIB, 0, 1 << 50)


#: (model, VRAM over reserves in MiB, the plan kind it gives, the flags of every rung).
LADDERS = {
    "moe-n-cpu-moe": (MOE, 340, OffloadKind.N_CPU_MOE, [
        ("--n-cpu-moe", "2", "-ngl", "5"),
        ("--cpu-moe", "-ngl", "5"),
        ("--cpu-moe",),
        ("--cpu-moe", "--no-kv-offload"),
    ]),
    "moe-cpu-moe-pinned": (MOE, 200, OffloadKind.CPU_MOE, [
        ("--cpu-moe", "-ngl", "5"),
        ("--cpu-moe",),
        ("--cpu-moe", "--no-kv-offload"),
    ]),
    "moe-cpu-moe-unpinned": (MOE, 100, OffloadKind.CPU_MOE, [
        ("--cpu-moe",),
        ("--cpu-moe", "--no-kv-offload"),
    ]),
    "moe-fits": (MOE, 1000, OffloadKind.NONE, [
        (),
        ("--cpu-moe",),
        ("--cpu-moe", "--no-kv-offload"),
    ]),
    "moe-no-gpu": (MOE, -2000, OffloadKind.ENGINE_FIT, [
        (),
        ("--cpu-moe",),
        ("--cpu-moe", "--no-kv-offload"),
    ]),
    "dense-n-cpu-ffn": (DENSE, 340, OffloadKind.N_CPU_FFN, [
        ("--n-cpu-ffn", "2", "-ngl", "5"),
        ("--n-cpu-ffn", "4", "-ngl", "5"),
        ("--n-cpu-ffn", "4"),
        ("--n-cpu-ffn", "4", "--no-kv-offload"),
    ]),
    "dense-n-cpu-ffn-every-block": (DENSE, 200, OffloadKind.N_CPU_FFN, [
        ("--n-cpu-ffn", "4", "-ngl", "5"),
        ("--n-cpu-ffn", "4"),
        ("--n-cpu-ffn", "4", "--no-kv-offload"),
    ]),
    "dense-fits": (DENSE, 1000, OffloadKind.NONE, [
        (),
        ("--no-kv-offload",),
    ]),
    "dense-engine-fit": (DENSE, 100, OffloadKind.ENGINE_FIT, [
        (),
        ("--no-kv-offload",),
    ]),
}


@pytest.mark.parametrize(("model", "vram", "kind", "flags"), LADDERS.values(),
                         ids=LADDERS.keys())
def test_ladder_rungs(model: ModelFacts, vram: int, kind: OffloadKind,
                      flags: list[tuple[str, ...]]) -> None:
    plan = plan_for(model, vram)
    assert plan.kind is kind, plan.reason
    rungs = ladder_for(model, plan)
    assert [rung.flags for rung in rungs] == flags
    assert rungs[0].step is Step.PLANNED
    assert rungs[0].reason == plan.reason
    assert all(rung.ctx_size is None for rung in rungs)


def test_moe_ladder_steps_in_reference_order() -> None:
    rungs = ladder_for(MOE, plan_for(MOE, 340), ctx_size=8192)
    assert [rung.step for rung in rungs] == [
        Step.PLANNED, Step.ALL_EXPERTS_TO_CPU, Step.LAYERS_TO_ENGINE, Step.KV_TO_CPU,
        Step.SMALLER_CONTEXT, Step.SMALLER_CONTEXT]
    assert [rung.ctx_size for rung in rungs] == [8192] * 4 + [4096, 2048]
    assert [rung.label for rung in rungs] == [
        "as planned: --n-cpu-moe 2 -ngl 5",
        "every expert to system RAM (--cpu-moe)",
        "GPU layer count left to llama-server (no -ngl 5)",
        "KV cache in system RAM (--no-kv-offload)",
        "context 8192 → 4096",
        "context 4096 → 2048",
    ]


def test_dense_ladder_steps_in_reference_order() -> None:
    rungs = ladder_for(DENSE, plan_for(DENSE, 340), ctx_size=4096)
    assert [rung.step for rung in rungs] == [
        Step.PLANNED, Step.ALL_FFN_TO_CPU, Step.LAYERS_TO_ENGINE, Step.KV_TO_CPU,
        Step.SMALLER_CONTEXT]
    assert rungs[1].label == "every block's dense FFN to system RAM (--n-cpu-ffn 4)"
    assert rungs[-1].ctx_size == 2048


@pytest.mark.parametrize(("ctx", "min_ctx", "halvings"), [
    (None, DEFAULT_MIN_CTX_SIZE, []),
    (8192, 2048, [4096, 2048]),
    (8192, 4096, [4096]),
    (8192, 8192, []),
    (3000, 1500, [1500]),
    (3000, 1501, []),
    (512, 128, [256, 128]),
], ids=["left-to-server", "down-to-floor", "floor-4096", "at-floor", "odd-exact",
        "odd-under-floor", "small"])
def test_context_rungs_halve_an_explicit_context_to_the_floor(
        ctx: int | None, min_ctx: int, halvings: list[int]) -> None:
    rungs = ladder_for(DENSE, plan_for(DENSE, 1000), ctx, min_ctx)
    smaller = [rung.ctx_size for rung in rungs if rung.step is Step.SMALLER_CONTEXT]
    assert smaller == halvings


def last_rung(model: ModelFacts, vram: int, ctx: int | None = None) -> Rung:
    return ladder_for(model, plan_for(model, vram), ctx)[-1]


@pytest.mark.parametrize(("model", "vram", "ctx", "words"), [
    (MOE, 340, None, "every expert is in system RAM (dropping --cpu-moe would put them back"),
    (DENSE, 340, None, "every block's dense FFN is in system RAM"),
    (DENSE, 1000, None, "there is no dense FFN split to widen"),
    (DENSE, 1000, None, "the context was left to the server"),
    (MOE, 340, 8192, "the context 2048 cannot halve without going under 2048"),
], ids=["moe", "dense-split", "dense-no-split", "ctx-left-to-server", "ctx-at-floor"])
def test_the_last_rung_says_nothing_safer_is_left(model: ModelFacts, vram: int,
                                                  ctx: int | None, words: str) -> None:
    rung = last_rung(model, vram, ctx)
    assert next_rung(rung) is None
    reason = end_reason(rung)
    assert reason is not None
    assert reason.startswith("nothing safer left: ")
    assert words in reason


def test_a_rung_with_a_next_has_no_end_reason() -> None:
    top = first_rung(MOE, plan_for(MOE, 340))
    assert end_reason(top) is None
    following = next_rung(top)
    assert following is not None
    assert following.reason == ("GPU out of memory at start — retrying with all experts in "
                                "system RAM")


def test_each_rung_is_strictly_safer_than_the_one_before() -> None:
    for model, vram, _, _ in LADDERS.values():
        rungs = ladder_for(model, plan_for(model, vram), 16384)
        for before, after in itertools.pairwise(rungs):
            assert after.safety.strictly_safer_than(before.safety), (before, after)
            assert not before.safety.strictly_safer_than(after.safety)


def test_min_ctx_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="min_ctx_size must be at least 1"):
        next_rung(first_rung(DENSE, plan_for(DENSE, 1000)), 0)
