"""Where a model's weights go when it does not fit the GPU: experts or dense FFN to RAM (pure).

Ported behaviour (reference 003, its offload planner; docs/references.md):

- everything fits (weights + reserves ≤ VRAM) → full GPU residency, no offload flags;
- MoE with exact per-layer sizes: the non-expert residue (attention, norms, router,
  shared experts, embeddings, output head) stays on the GPU; the expert budget left
  beside it holds the **largest trailing suffix** of blocks' experts, packed greedily from
  the last block down and stopping at the first that does not fit. ``--n-cpu-moe N``
  keeps blocks ``0..N-1``'s experts in system RAM, so N = block_count - kept suffix,
  with every layer pinned to the GPU (``-ngl``). No expert layer fits → ``--cpu-moe``
  pinned; the residue alone over VRAM → ``--cpu-moe`` with ``-ngl`` *not* pinned, so
  llama-server's own fit can drop whole layers (a hard pin is how reference 003's
  earlier binary plan hit OOM on sub-6 GB cards);
- MoE without exact sizes (the binary tier): over VRAM → ``--cpu-moe`` pinned;
- dense with exact sizes: the same suffix packing over the dense FFN tensors with
  ``--n-cpu-ffn N`` (blocks ``0..N-1``'s ``ffn_gate/up/down`` to RAM), only when the moved
  prefix plus the headroom margin fits the system-RAM budget; otherwise, and whenever
  the non-FFN residue alone is over VRAM or the sizes are unknown, the planner makes no
  split and leaves whole-layer fitting to llama-server (``--fit``): reference 003 has
  deliberately no estimate-only dense split, because it pins ``-ngl``.

A build that lacks a switch the plan would use (its ``--help`` is the judge,
``build_support.py``) gets the nearest plan it can run, and the plan says so
(``OffloadPlan.wanted``): without ``--n-cpu-moe``, ``--cpu-moe`` pinned (every expert
rather than a prefix of them, so it fits wherever the split did); without that either, or
without ``--n-cpu-ffn``, a plain ``-ngl`` split (``layer_split``: the output layer and the
largest trailing run of whole blocks that fits go to the GPU, the rest stays on the CPU),
which every llama-server has; with no per-layer sizes to size one, the engine's fit.

Reserves beside the weights, per reference 003: a 1 GiB headroom margin for the driver,
the OS and other processes, a flat 512 MiB for llama-server's compute buffers, the KV
cache, and a drafter's resident bytes. The estimate tier (no per-layer sizes) prices the
weights at the GGUF file size with the same reserves, so both tiers agree on what must fit.
Reference 003 sizes RAM only for the dense split (experts moved by ``--n-cpu-moe`` stay
memory-mapped from the file), and so does this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.capability import not_supported_reason

MIB = 1024**2
GIB = 1024**3
#: Headroom for the driver, the OS and other processes beyond the model (reference 003).
DEFAULT_MARGIN_BYTES = GIB
#: Flat reserve for llama-server's compute buffers (activations, graphs); reference 003
#: sized it from llama-server allocations on 7B to 30B models and lets the OOM ladder catch
#: the outliers.
COMPUTE_RESERVE_BYTES = 512 * MIB


class OffloadKind(Enum):
    """What a plan does with the weights.

    ``n_cpu_moe``, ``cpu_moe`` and ``n_cpu_ffn`` name llama-server's own switches
    (``common/arg.cpp``: ``--n-cpu-moe``, ``--cpu-moe``, ``--n-cpu-ffn``). ``none`` and
    ``engine_fit`` are reference 003's two "no decision" outcomes told apart: ``none``
    because everything fits, ``engine_fit`` because it does not and no split applies, so
    llama-server's ``--fit`` drops whole layers to the CPU. ``layer_split`` is ours: the
    plan pins ``-ngl`` to the whole layers that fit, for a build without the override
    switch the plan wanted.
    """

    NONE = "none"
    N_CPU_MOE = "n_cpu_moe"
    CPU_MOE = "cpu_moe"
    N_CPU_FFN = "n_cpu_ffn"
    LAYER_SPLIT = "layer_split"
    ENGINE_FIT = "engine_fit"


#: How far each kind moves weights off the GPU, for ``OffloadPlan.rank``: a partial split,
#: then every expert, then the planner giving up its split to the engine's layer fit.
_STAGE: dict[OffloadKind, int] = {
    OffloadKind.NONE: 0,
    OffloadKind.N_CPU_MOE: 1,
    OffloadKind.N_CPU_FFN: 1,
    OffloadKind.CPU_MOE: 2,
    # Whole blocks, attention and KV included, leave the GPU: more than every expert.
    OffloadKind.LAYER_SPLIT: 2,
    OffloadKind.ENGINE_FIT: 3,
}


#: The override switch of each kind that has one (common/arg.cpp); the other kinds send
#: only ``-ngl``, which every llama-server has.
OVERRIDE_FLAGS: dict[OffloadKind, str] = {
    OffloadKind.N_CPU_MOE: "--n-cpu-moe",
    OffloadKind.CPU_MOE: "--cpu-moe",
    OffloadKind.N_CPU_FFN: "--n-cpu-ffn",
}


def offload_flags(kind: OffloadKind, n: int | None, gpu_layers: int | None) -> tuple[str, ...]:
    """The llama-server flags for an offload choice (shared by plans and ladder rungs)."""
    flags: list[str] = []
    if kind in (OffloadKind.N_CPU_MOE, OffloadKind.N_CPU_FFN):
        flags += [OVERRIDE_FLAGS[kind], str(n)]
    elif kind is OffloadKind.CPU_MOE:
        flags.append(OVERRIDE_FLAGS[kind])
    if gpu_layers is not None:
        flags += ["-ngl", str(gpu_layers)]
    return tuple(flags)


def all_layers(block_count: int) -> int:
    """The ``-ngl`` value that pins every layer to the GPU.

    llama.cpp offloads ``n_layer + 1`` layers at most (the repeating blocks and the output
    layer; ``llama_model::n_gpu_layers`` in ``src/llama-model.cpp``) and clamps larger
    values, so this is what ``-ngl all`` means, written as a number older builds accept.
    """
    return block_count + 1


@dataclass(frozen=True)
class OffloadPlan:
    """An offload decision, the flags it implies and the sizes that drove it."""

    kind: OffloadKind
    #: The N of ``--n-cpu-moe N`` / ``--n-cpu-ffn N``; None for the other kinds.
    n: int | None
    #: ``-ngl`` pinned to this many layers; None leaves the layer count to llama-server.
    gpu_layers: int | None
    #: Blocks whose experts (MoE) or dense FFN (dense) the plan itself puts in system RAM.
    cpu_layers: int
    #: Model weights the plan keeps on the GPU / moves to system RAM (None: unknown,
    #: no per-layer sizes or left to the engine's fit).
    gpu_bytes: int | None
    ram_bytes: int | None
    #: KV + drafter + compute reserve + headroom margin kept free beside the weights.
    reserve_bytes: int
    #: True when the decision came from exact per-layer tensor sizes.
    exact: bool
    reason: str
    #: The kinds the build lacks the switch of (the planner and the ladder avoid them).
    unavailable: frozenset[OffloadKind] = frozenset()
    #: The kind the plan would have taken on a build with every switch; None when it did.
    wanted: OffloadKind | None = None

    @property
    def flags(self) -> tuple[str, ...]:
        """The llama-server flags this plan adds to a launch (``-ngl`` included when pinned)."""
        return offload_flags(self.kind, self.n, self.gpu_layers)

    @property
    def rank(self) -> tuple[int, int, int]:
        """How aggressively the plan moves weights off the GPU; larger is more aggressive.

        Ordered by kind stage (none < partial split < all experts < engine fit), then the
        number of blocks moved, then whether ``-ngl`` is left to the engine.
        """
        return (_STAGE[self.kind], self.cpu_layers, int(self.gpu_layers is None))


@dataclass(frozen=True)
class _Budget:
    """The VRAM budget and what must stay free beside the weights."""

    vram: int
    margin: int
    reserves: int


def plan_offload(model: ModelFacts, vram_budget_bytes: int, kv_bytes: int,
                 ram_budget_bytes: int, drafter_bytes: int = 0, *,
                 margin_bytes: int = DEFAULT_MARGIN_BYTES,
                 compute_reserve_bytes: int = COMPUTE_RESERVE_BYTES,
                 unavailable: frozenset[OffloadKind] = frozenset(),
                 avoided: frozenset[OffloadKind] = frozenset()) -> OffloadPlan:
    """Plan where ``model``'s weights go for a launch.

    ``vram_budget_bytes``: GPU memory this launch may use (0 or less: no GPU);
    ``kv_bytes``: the KV cache the launch allocates on the GPU; ``ram_budget_bytes``: the
    system RAM the moved weights may take (the caller passes the smaller of a configured
    budget and the free RAM); ``drafter_bytes``: a speculative drafter's resident bytes;
    ``unavailable``: kinds whose switch the build lacks (``build_support.py``);
    ``avoided``: kinds the caller asks the plan not to use (``harness tune``'s offload
    candidates): the same substitutes, without "not supported".
    Raises ValueError when ``model.layer_bytes`` is present but not one entry per block.
    """
    margin = max(0, margin_bytes)
    reserves = margin + max(0, kv_bytes) + max(0, compute_reserve_bytes) + max(0, drafter_bytes)
    budget = _Budget(vram_budget_bytes, margin, reserves)
    layers = _ordered_layers(model)
    ideal = _plan_ideal(model, layers, budget, ram_budget_bytes)
    if ideal.kind not in unavailable | avoided:
        return replace(ideal, unavailable=unavailable)
    lacks = ideal.kind in unavailable  # else only asked: no "not supported", no ``wanted``
    lacking = (not_supported_reason([OVERRIDE_FLAGS[ideal.kind]]) if lacks
               else f"{OVERRIDE_FLAGS[ideal.kind]} left out as asked")
    return replace(_substitute(ideal, model, layers, budget, unavailable | avoided,
                               lacking=lacking),
                   unavailable=unavailable, wanted=ideal.kind if lacks else None)


def _plan_ideal(model: ModelFacts, layers: tuple[LayerBytes, ...], budget: _Budget,
                ram_budget_bytes: int) -> OffloadPlan:
    """The plan on a build with every switch (reference 003's planner)."""
    vram_budget_bytes = budget.vram
    if vram_budget_bytes <= 0:
        return _engine_fit(budget, layers != (),
                           f"no GPU memory budget ({_mib(vram_budget_bytes)}) — GPU offload "
                           "left to llama-server")
    if not layers:
        return _plan_by_estimate(model, budget)
    if model.is_moe:
        return _plan_moe(model, layers, budget)
    return _plan_dense(model, layers, budget, ram_budget_bytes)


def _ordered_layers(model: ModelFacts) -> tuple[LayerBytes, ...]:
    """The per-layer sizes by block index, () when unknown; one per block or ValueError."""
    if not model.layer_bytes:
        return ()
    layers = tuple(sorted(model.layer_bytes, key=lambda layer: layer.index))
    if [layer.index for layer in layers] != list(range(model.block_count)):
        raise ValueError(
            f"{model.path}: layer_bytes must hold blocks 0..{model.block_count - 1} once each, "
            f"got indices {[layer.index for layer in layers]}")
    return layers


def _plan_by_estimate(model: ModelFacts, budget: _Budget) -> OffloadPlan:
    """No per-layer sizes: price the weights at the file size (reference 003's binary tier)."""
    need = model.file_size + budget.reserves
    sizes = (f"file {_mib(model.file_size)} + reserves {_mib(budget.reserves)} "
             f"{'≤' if need <= budget.vram else '>'} VRAM {_mib(budget.vram)}")
    if need <= budget.vram:
        return OffloadPlan(OffloadKind.NONE, None, None, 0, model.file_size, 0,
                           budget.reserves, False, f"fits the GPU by estimate ({sizes})")
    if model.is_moe:
        return OffloadPlan(
            OffloadKind.CPU_MOE, None, all_layers(model.block_count), model.block_count,
            None, None, budget.reserves, False,
            f"MoE over VRAM by estimate ({sizes}), no per-layer sizes — --cpu-moe: every "
            "expert to system RAM, attention on the GPU")
    return _engine_fit(budget, False,
                       f"dense model over VRAM by estimate ({sizes}) and no per-layer sizes to "
                       "split its FFN — whole-layer fit left to llama-server")


def _fits_whole(weights: int, budget: _Budget, what: str) -> OffloadPlan | None:
    """Full GPU residency when exact weights and the reserves fit VRAM, else None."""
    if weights + budget.reserves > budget.vram:
        return None
    return OffloadPlan(
        OffloadKind.NONE, None, None, 0, weights, 0, budget.reserves, True,
        f"{what} fits VRAM (weights {_mib(weights)} + reserves {_mib(budget.reserves)} ≤ "
        f"{_mib(budget.vram)}) — full GPU residency")


def _plan_moe(model: ModelFacts, layers: Sequence[LayerBytes], budget: _Budget) -> OffloadPlan:
    """MoE with exact sizes: keep the largest trailing suffix of expert layers on the GPU."""
    experts = [layer.expert for layer in layers]
    expert_total = sum(experts)
    # --n-cpu-moe moves only ffn_*_exps; shared experts and dense FFN stay with the residue.
    residue = model.non_layer_bytes + sum(layer.other + layer.dense_ffn for layer in layers)
    weights = residue + expert_total
    blocks = model.block_count
    if fits := _fits_whole(weights, budget, "MoE"):
        return fits
    expert_budget = budget.vram - budget.reserves - residue
    if expert_budget < 0:
        return OffloadPlan(
            OffloadKind.CPU_MOE, None, None, blocks, residue, expert_total, budget.reserves,
            True,
            f"non-expert residue {_mib(residue)} + reserves {_mib(budget.reserves)} exceed "
            f"VRAM {_mib(budget.vram)} — --cpu-moe with the GPU layer count left to "
            "llama-server")
    kept, kept_bytes = _pack_suffix(experts, expert_budget)
    if kept_bytes == 0:
        return OffloadPlan(
            OffloadKind.CPU_MOE, None, all_layers(blocks), blocks, residue, expert_total,
            budget.reserves, True,
            f"expert budget {_mib(expert_budget)} holds no expert layer (last block's "
            f"experts {_mib(experts[-1])}) — --cpu-moe: every expert to system RAM")
    # kept < blocks here: a suffix of every block would have fit the check above.
    n = blocks - kept
    return OffloadPlan(
        OffloadKind.N_CPU_MOE, n, all_layers(blocks), n, residue + kept_bytes,
        expert_total - kept_bytes, budget.reserves, True,
        f"experts of the last {kept}/{blocks} blocks fit VRAM ({_mib(kept_bytes)} of "
        f"{_mib(expert_total)}, residue {_mib(residue)}, reserves {_mib(budget.reserves)}, "
        f"VRAM {_mib(budget.vram)}) — --n-cpu-moe {n}")


def _plan_dense(model: ModelFacts, layers: Sequence[LayerBytes], budget: _Budget,
                ram_budget: int) -> OffloadPlan:
    """Dense with exact sizes: ``--n-cpu-ffn N`` when GPU and RAM both hold their part."""
    ffn = [layer.dense_ffn for layer in layers]
    ffn_total = sum(ffn)
    residue = model.non_layer_bytes + sum(layer.other + layer.expert for layer in layers)
    weights = residue + ffn_total
    blocks = model.block_count
    if fits := _fits_whole(weights, budget, "dense model"):
        return fits
    if ffn_total <= 0:
        return _engine_fit(budget, True,
                           f"dense model over VRAM (weights {_mib(weights)} + reserves "
                           f"{_mib(budget.reserves)} > {_mib(budget.vram)}) with no dense FFN "
                           "tensors to move — whole-layer fit left to llama-server")
    ffn_budget = budget.vram - budget.reserves - residue
    if ffn_budget < 0:
        return _engine_fit(budget, True,
                           f"dense non-FFN residue {_mib(residue)} + reserves "
                           f"{_mib(budget.reserves)} exceed VRAM {_mib(budget.vram)} — "
                           "whole-layer fit left to llama-server")
    kept, kept_bytes = _pack_suffix(ffn, ffn_budget)
    n = blocks - kept
    cpu_bytes = ffn_total - kept_bytes
    if cpu_bytes + budget.margin > ram_budget:
        return _engine_fit(budget, True,
                           f"dense FFN split (--n-cpu-ffn {n}) needs {_mib(cpu_bytes)} of "
                           f"system RAM + {_mib(budget.margin)} headroom, above the "
                           f"{_mib(ram_budget)} RAM budget — whole-layer fit left to "
                           "llama-server")
    return OffloadPlan(
        OffloadKind.N_CPU_FFN, n, all_layers(blocks), n, residue + kept_bytes, cpu_bytes,
        budget.reserves, True,
        f"dense FFN of the last {kept}/{blocks} blocks fits VRAM ({_mib(kept_bytes)} of "
        f"{_mib(ffn_total)}, non-FFN {_mib(residue)}, reserves {_mib(budget.reserves)}, "
        f"VRAM {_mib(budget.vram)}); the first {n} blocks' FFN ({_mib(cpu_bytes)}) fit the "
        f"{_mib(ram_budget)} RAM budget — --n-cpu-ffn {n}")


def _substitute(ideal: OffloadPlan, model: ModelFacts, layers: Sequence[LayerBytes],
                budget: _Budget, unavailable: frozenset[OffloadKind], *,
                lacking: str) -> OffloadPlan:
    """The nearest plan without ``ideal.kind``'s switch; ``lacking`` says why it is out."""
    if ideal.kind is OffloadKind.N_CPU_MOE and OffloadKind.CPU_MOE not in unavailable:
        # Every expert instead of the first N blocks': the residue fitted beside the kept
        # suffix, so it fits beside none. (N_CPU_MOE is only planned from exact sizes.)
        experts = sum(layer.expert for layer in layers)
        residue = model.non_layer_bytes + sum(layer.total for layer in layers) - experts
        return replace(ideal, kind=OffloadKind.CPU_MOE, n=None, cpu_layers=model.block_count,
                       gpu_bytes=residue, ram_bytes=experts,
                       reason=f"{lacking} — --cpu-moe instead: every expert to system RAM, "
                              f"not only the first {ideal.n} blocks' ({ideal.reason})")
    if layers:
        return _layer_split(model, layers, budget, lacking)
    return _engine_fit(budget, False, f"{lacking}, and no per-layer sizes to split whole "
                                      "layers by — whole-layer fit left to llama-server")


def _layer_split(model: ModelFacts, layers: Sequence[LayerBytes], budget: _Budget,
                 lacking: str) -> OffloadPlan:
    """``-ngl K``: the output layer and the last ``K - 1`` whole blocks on the GPU.

    ``-ngl K`` puts the last K of the ``n_layer + 1`` layers on the GPU, the output layer
    first (``planned_share.py``); the input layer stays on the CPU. Every byte outside the
    blocks is counted on the GPU, and the whole KV cache stays in the reserves, so the
    split errs towards the CPU.
    """
    totals = [layer.total for layer in layers]
    blocks = model.block_count
    room = budget.vram - budget.reserves - model.non_layer_bytes
    kept, kept_bytes = _pack_suffix(totals, room) if room >= 0 else (0, 0)
    if kept == 0:
        return _engine_fit(budget, True,
                           f"{lacking}, and no whole block fits beside the output layer and "
                           f"the reserves ({_mib(budget.reserves)}, VRAM {_mib(budget.vram)}) "
                           "— whole-layer fit left to llama-server")
    on_gpu = model.non_layer_bytes + kept_bytes
    return OffloadPlan(
        OffloadKind.LAYER_SPLIT, None, kept + 1, blocks - kept, on_gpu,
        sum(totals) - kept_bytes, budget.reserves, True,
        f"{lacking} — whole layers instead: the last {kept}/{blocks} blocks and the output "
        f"layer fit VRAM ({_mib(on_gpu)} with reserves {_mib(budget.reserves)}, VRAM "
        f"{_mib(budget.vram)}) — -ngl {kept + 1}")


def _pack_suffix(sizes: Sequence[int], budget: int) -> tuple[int, int]:
    """Blocks and bytes of the longest trailing run of ``sizes`` whose sum fits ``budget``.

    Greedy from the last block down, stopping at the first that does not fit: the flags
    can only move a prefix ``0..N-1``, so the GPU's share must be a suffix.
    """
    kept = kept_bytes = 0
    for size in reversed(sizes):
        if kept_bytes + size > budget:
            break
        kept += 1
        kept_bytes += size
    return kept, kept_bytes


def _engine_fit(budget: _Budget, exact: bool, reason: str) -> OffloadPlan:
    return OffloadPlan(OffloadKind.ENGINE_FIT, None, None, 0, None, None, budget.reserves,
                       exact, reason)


def _mib(size: int) -> str:
    return f"{size / MIB:.1f} MiB"
