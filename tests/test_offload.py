"""The offload planner, one case per rule of reference 003 (``harness/planning/offload.py``).

Reference 003 is described in docs/references.md.

Sizes are whole MiB so the cases read as arithmetic. Every plan pays the reference's
reserves: 1 GiB headroom + 512 MiB compute (``RESERVES``), plus KV and drafter bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import pytest

from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.offload import (
    COMPUTE_RESERVE_BYTES,
    DEFAULT_MARGIN_BYTES,
    MIB,
    OffloadKind,
    OffloadPlan,
    offload_flags,
    plan_offload,
)

RESERVES = DEFAULT_MARGIN_BYTES + COMPUTE_RESERVE_BYTES
PLENTY_OF_RAM = 1 << 50


def make_model(expert: Sequence[int] = (), dense_ffn: Sequence[int] = (),
               other: int = 0, non_layer: int = 0, *, moe: bool, blocks: int | None = None,
               file_size: int = 0) -> ModelFacts:
    """A model whose per-layer sizes are given in MiB (empty: sizes unknown)."""
    sizes = list(expert) or list(dense_ffn)
    block_count = blocks if blocks is not None else len(sizes)
    layers = tuple(
        LayerBytes(index=i,
                   expert=(expert[i] if expert else 0) * MIB,
                   dense_ffn=(dense_ffn[i] if dense_ffn else 0) * MIB,
                   other=other * MIB)
        for i in range(len(sizes)))
    return ModelFacts(
        path="model.gguf", file_size=file_size * MIB, architecture="test",
        block_count=block_count, context_length=4096, embedding_length=64, head_count=4,
        head_count_kv=(2,) * block_count, key_length=16, value_length=16, vocab_size=269,
        expert_count=8 if moe else 0, expert_used_count=2 if moe else 0,
        layer_bytes=layers, non_layer_bytes=non_layer * MIB)


def moe(expert: Sequence[int], other: int = 10, non_layer: int = 100) -> ModelFacts:
    return make_model(expert, other=other, non_layer=non_layer, moe=True)


def dense(ffn: Sequence[int], other: int = 10, non_layer: int = 100) -> ModelFacts:
    return make_model(dense_ffn=ffn, other=other, non_layer=non_layer, moe=False)


@dataclass(frozen=True)
class Case:
    model: ModelFacts
    #: VRAM beyond RESERVES, in MiB (may be negative: less than the reserves).
    vram_over_reserves: float
    kind: OffloadKind
    n: int | None
    gpu_layers: int | None
    kv: int = 0
    drafter: int = 0
    ram: int = PLENTY_OF_RAM

    def plan(self) -> OffloadPlan:
        vram = RESERVES + int(self.vram_over_reserves * MIB)
        return plan_offload(self.model, vram, self.kv * MIB, self.ram, self.drafter * MIB)


# Four MoE blocks of 100 MiB experts; residue = 100 + 4 x 10 = 140 MiB; weights 540 MiB.
MOE4 = moe([100, 100, 100, 100])
# Four dense blocks of 100 MiB FFN; non-FFN residue 140 MiB; weights 540 MiB.
DENSE4 = dense([100, 100, 100, 100])

CASES = {
    "moe-fits": Case(MOE4, 1000, OffloadKind.NONE, None, None),
    "moe-fits-exactly": Case(MOE4, 540, OffloadKind.NONE, None, None),
    "moe-one-byte-short-moves-one-block": Case(MOE4, 540 - 1 / MIB, OffloadKind.N_CPU_MOE, 1, 5),
    "moe-exactly-3-layers-fit": Case(MOE4, 140 + 300, OffloadKind.N_CPU_MOE, 1, 5),
    "moe-exactly-2-layers-fit": Case(MOE4, 140 + 200, OffloadKind.N_CPU_MOE, 2, 5),
    "moe-2-layers-and-almost-3": Case(MOE4, 140 + 299, OffloadKind.N_CPU_MOE, 2, 5),
    "moe-exactly-1-layer-fits": Case(MOE4, 140 + 100, OffloadKind.N_CPU_MOE, 3, 5),
    "moe-suffix-stops-at-first-misfit": Case(
        moe([10, 10, 400, 10]), 140 + 30, OffloadKind.N_CPU_MOE, 3, 5),
    "moe-leading-dense-block-counts-in-n": Case(
        moe([0, 100, 100]), 130 + 100, OffloadKind.N_CPU_MOE, 2, 4),
    "moe-no-expert-layer-fits": Case(MOE4, 140 + 99, OffloadKind.CPU_MOE, None, 5),
    "moe-residue-exactly-fills-vram": Case(MOE4, 140, OffloadKind.CPU_MOE, None, 5),
    "moe-residue-over-vram-leaves-ngl-unpinned": Case(
        MOE4, 139, OffloadKind.CPU_MOE, None, None),
    "moe-kv-pushes-one-block-out": Case(MOE4, 540, OffloadKind.N_CPU_MOE, 1, 5, kv=1),
    "moe-drafter-pushes-one-block-out": Case(
        MOE4, 540, OffloadKind.N_CPU_MOE, 1, 5, drafter=1),
    "moe-drafter-pushes-two-blocks-out": Case(
        MOE4, 140 + 300, OffloadKind.N_CPU_MOE, 2, 5, drafter=100),
    "moe-drafter-pushes-every-expert-out": Case(
        MOE4, 140 + 100, OffloadKind.CPU_MOE, None, 5, drafter=1),
    "moe-drafter-pushes-residue-over-vram": Case(
        MOE4, 140, OffloadKind.CPU_MOE, None, None, drafter=1),
    "moe-ram-budget-does-not-gate-experts": Case(
        MOE4, 140 + 100, OffloadKind.N_CPU_MOE, 3, 5, ram=0),
    "dense-fits": Case(DENSE4, 540, OffloadKind.NONE, None, None),
    "dense-prefix-to-ram": Case(DENSE4, 140 + 250, OffloadKind.N_CPU_FFN, 2, 5),
    "dense-exactly-3-layers-fit": Case(DENSE4, 140 + 300, OffloadKind.N_CPU_FFN, 1, 5),
    "dense-no-ffn-layer-fits": Case(DENSE4, 140 + 99, OffloadKind.N_CPU_FFN, 4, 5),
    "dense-ram-holds-prefix-exactly": Case(
        DENSE4, 140 + 200, OffloadKind.N_CPU_FFN, 2, 5,
        ram=200 * MIB + DEFAULT_MARGIN_BYTES),
    "dense-ram-one-byte-too-small": Case(
        DENSE4, 140 + 200, OffloadKind.ENGINE_FIT, None, None,
        ram=200 * MIB + DEFAULT_MARGIN_BYTES - 1),
    "dense-residue-over-vram": Case(DENSE4, 139, OffloadKind.ENGINE_FIT, None, None),
    "dense-drafter-pushes-one-block-out": Case(
        DENSE4, 540, OffloadKind.N_CPU_FFN, 1, 5, drafter=1),
    "dense-drafter-moves-prefix-past-ram": Case(
        DENSE4, 140 + 300, OffloadKind.ENGINE_FIT, None, None, drafter=100,
        ram=150 * MIB + DEFAULT_MARGIN_BYTES),
    "dense-without-ffn-tensors-over-vram": Case(
        dense([0, 0]), 119, OffloadKind.ENGINE_FIT, None, None),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_plan_follows_reference_rules(case: Case) -> None:
    plan = case.plan()
    assert (plan.kind, plan.n, plan.gpu_layers) == (case.kind, case.n, case.gpu_layers), (
        plan.reason)


ESTIMATE_CASES = {
    "moe-without-sizes-fits": (True, 500, OffloadKind.NONE, None),
    "moe-without-sizes-fits-exactly": (True, 1000, OffloadKind.NONE, None),
    "moe-without-sizes-over-vram-cpu-moe-pinned": (True, 1001, OffloadKind.CPU_MOE, 9),
    "dense-without-sizes-fits": (False, 1000, OffloadKind.NONE, None),
    "dense-without-sizes-over-vram-engine-fit": (False, 1001, OffloadKind.ENGINE_FIT, None),
}


@pytest.mark.parametrize(("is_moe", "file_mib", "kind", "gpu_layers"),
                         ESTIMATE_CASES.values(), ids=ESTIMATE_CASES.keys())
def test_without_per_layer_sizes_the_file_size_decides(
        is_moe: bool, file_mib: int, kind: OffloadKind, gpu_layers: int | None) -> None:
    model = make_model(moe=is_moe, blocks=8, file_size=file_mib)
    plan = plan_offload(model, RESERVES + 1000 * MIB, 0, PLENTY_OF_RAM)
    assert (plan.kind, plan.gpu_layers, plan.exact) == (kind, gpu_layers, False)
    assert plan.n is None


@pytest.mark.parametrize("is_moe", [True, False], ids=["moe", "dense"])
@pytest.mark.parametrize("vram", [0, -1], ids=["zero", "negative"])
def test_no_gpu_budget_leaves_offload_to_the_server(is_moe: bool, vram: int) -> None:
    plan = plan_offload(MOE4 if is_moe else DENSE4, vram, 0, PLENTY_OF_RAM)
    assert plan.kind is OffloadKind.ENGINE_FIT
    assert plan.flags == ()
    assert "no GPU memory budget" in plan.reason


FLAG_CASES = {
    "moe-partial": ("moe-exactly-2-layers-fit", ("--n-cpu-moe", "2", "-ngl", "5")),
    "moe-all-pinned": ("moe-no-expert-layer-fits", ("--cpu-moe", "-ngl", "5")),
    "moe-all-unpinned": ("moe-residue-over-vram-leaves-ngl-unpinned", ("--cpu-moe",)),
    "dense-prefix": ("dense-prefix-to-ram", ("--n-cpu-ffn", "2", "-ngl", "5")),
    "fits": ("moe-fits", ()),
    "engine-fit": ("dense-residue-over-vram", ()),
}


@pytest.mark.parametrize(("case_id", "flags"), FLAG_CASES.values(), ids=FLAG_CASES.keys())
def test_flags_are_the_llama_server_switches(case_id: str, flags: tuple[str, ...]) -> None:
    assert CASES[case_id].plan().flags == flags


def test_flag_translation_is_shared() -> None:
    assert offload_flags(OffloadKind.N_CPU_MOE, 3, None) == ("--n-cpu-moe", "3")
    assert offload_flags(OffloadKind.NONE, None, 7) == ("-ngl", "7")


def test_partial_moe_plan_reports_the_bytes_and_reason() -> None:
    plan = CASES["moe-2-layers-and-almost-3"].plan()
    assert plan.gpu_bytes == (140 + 200) * MIB
    assert plan.ram_bytes == 200 * MIB
    assert plan.reserve_bytes == RESERVES
    assert plan.cpu_layers == 2
    assert plan.exact
    assert plan.reason == (
        "experts of the last 2/4 blocks fit VRAM (200.0 MiB of 400.0 MiB, residue 140.0 MiB, "
        "reserves 1536.0 MiB, VRAM 1975.0 MiB) — --n-cpu-moe 2")


def test_dense_plan_reports_the_bytes_and_reason() -> None:
    plan = CASES["dense-prefix-to-ram"].plan()
    assert (plan.gpu_bytes, plan.ram_bytes) == ((140 + 200) * MIB, 200 * MIB)
    assert "--n-cpu-ffn 2" in plan.reason
    assert "200.0 MiB" in plan.reason


@pytest.mark.parametrize(("case_id", "words"), [
    ("moe-residue-over-vram-leaves-ngl-unpinned", "non-expert residue 140.0 MiB"),
    ("moe-no-expert-layer-fits", "expert budget 99.0 MiB holds no expert layer"),
    ("dense-ram-one-byte-too-small", "above the 1224.0 MiB RAM budget"),
    ("dense-residue-over-vram", "dense non-FFN residue 140.0 MiB"),
    ("moe-fits", "full GPU residency"),
], ids=["residue", "no-expert-layer", "ram", "dense-residue", "fits"])
def test_reason_names_the_sizes_that_drove_it(case_id: str, words: str) -> None:
    assert words in CASES[case_id].plan().reason


def test_shared_experts_stay_with_the_residue_of_a_moe() -> None:
    # --n-cpu-moe moves only ffn_*_exps: a MoE block's dense FFN (shared experts, a
    # leading dense block) counts against the GPU like attention does.
    model = make_model([100, 100], dense_ffn=[50, 50], other=10, non_layer=100, moe=True)
    plan = plan_offload(model, RESERVES + (220 + 100) * MIB, 0, PLENTY_OF_RAM)
    assert (plan.kind, plan.n, plan.gpu_bytes) == (OffloadKind.N_CPU_MOE, 1, 320 * MIB)


def test_layer_order_in_the_facts_does_not_matter() -> None:
    shuffled = make_model([10, 20, 30, 40], other=0, non_layer=0, moe=True)
    reversed_layers = replace(shuffled, layer_bytes=tuple(reversed(shuffled.layer_bytes)))
    vram = RESERVES + 70 * MIB
    assert plan_offload(reversed_layers, vram, 0, 0) == plan_offload(shuffled, vram, 0, 0)
    assert plan_offload(shuffled, vram, 0, 0).n == 2


@pytest.mark.parametrize("indices", [(0, 2), (0, 0), (1, 2), (0,)],
                         ids=["gap", "duplicate", "shifted", "too-few"])
def test_layer_sizes_not_one_per_block_are_refused(indices: tuple[int, ...]) -> None:
    base = make_model([1, 1], moe=True)
    broken = replace(base, layer_bytes=tuple(LayerBytes(i, MIB, 0, 0) for i in indices))
    with pytest.raises(ValueError, match=r"layer_bytes must hold blocks 0\.\.1"):
        plan_offload(broken, RESERVES, 0, 0)


def test_margin_and_compute_reserve_can_be_set() -> None:
    plan = plan_offload(MOE4, 540 * MIB, 0, 0, margin_bytes=0, compute_reserve_bytes=0)
    assert plan.kind is OffloadKind.NONE
    assert plan.reserve_bytes == 0
