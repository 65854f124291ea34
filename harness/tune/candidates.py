"""The alternatives to a card's plan, planned, pruned and ranked (pure).

Every candidate is the current plan with one dimension changed (a "one-factor"
neighbourhood): the K/V cache type (each the build supports and
configs/gpu/kv_quality.json weights), flash attention, batch/ubatch, threads on a host
build, the number of slots, speculation (the drafter off where the plan drafts, on
where the model or bundle could and the plan does not), and where weights go when the
model does not fit the card (the planner's other offload kinds: ``--cpu-moe`` for
``--n-cpu-moe N``, whole layers for either split). Each goes through the planner
as a per-call override (speculation as the request's explicit spec type), so the
planner's own rules (cache types the build takes, fitting, offload, draft-mtp's one
slot, release rules) apply to it as to any launch; an offload kind is asked as a kind
the plan must avoid, so the planner's own substitute is what is measured. A candidate
the planner changes or cannot send is pruned with the reason; so is one that fits worse
than the current plan (fewer layers on the GPU, or weights moved to the host), except
an offload candidate, whose point is a different split.

Rank: predicted decode tokens/s (planning/decode_speed.py, at the deepest predicted depth,
the cache read at its type's read cost) times the K/V pair's quality weight (reference
004's score, docs/references.md). Only the KV type moves that prediction; the other
dimensions tie on it and keep the order of :data:`DIMENSIONS` — the measurement decides
them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from harness.planning.decode_speed import Bandwidths, predict_plan
from harness.planning.drafter import DRAFT_MTP, DRAFT_SIMPLE
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.offload import OffloadKind
from harness.tune.quality import KvQuality, pair_quality, pair_read_cost

KV = "kv"
FLASH_ATTN = "flash-attn"
BATCH = "batch"
THREADS = "threads"
SLOTS = "slots"
DRAFTER = "drafter"
OFFLOAD = "offload"
#: Every dimension, in the order candidates that tie on the prediction are measured.
DIMENSIONS = (KV, BATCH, FLASH_ATTN, THREADS, SLOTS, DRAFTER, OFFLOAD)
#: The explicit spec type that turns speculation off (planning/drafter.py).
NO_SPEC = "none"
#: The micro-batch sizes tried (llama.cpp's default is 512 in a batch of 2048).
UBATCH_SIZES = (256, 512, 1024, 2048)
#: The batch a plan that sets none runs with (llama-server's default).
DEFAULT_BATCH = 2048
DEFAULT_UBATCH = 512


@dataclass(frozen=True)
class Candidate:
    """One alternative (or, with no changes, the current plan itself)."""

    name: str
    dimension: str | None
    #: Per-call settings over the current plan's request (ServerSettings names).
    changes: Mapping[str, object]
    #: ``--threads`` (a launch field, not a card setting); None: the comparison's.
    threads: int | None
    plan: LaunchPlan
    #: What differs from the current plan, as ``field old -> new``.
    differs: tuple[str, ...]
    predicted_tps: float | None
    quality: float | None
    #: Why it is not measured (the planner changed or refused it); None: it is.
    pruned: str | None = None
    #: The spec type asked of the planner (``none``: no speculation); None: the plan's.
    spec_type: str | None = None
    #: Offload kinds the planner was asked to avoid (an offload candidate).
    avoid_offload: frozenset[OffloadKind] = frozenset()

    @property
    def score(self) -> float | None:
        if self.predicted_tps is None or self.quality is None:
            return None
        return self.predicted_tps * self.quality


@dataclass(frozen=True)
class TuneSpace:
    """What the candidates are drawn from."""

    request: PlanRequest
    weights: Mapping[str, KvQuality]
    #: The bandwidths the plans read at, or why they are unknown (then nothing is
    #: predicted and the dimension order alone ranks).
    bandwidths: Bandwidths | str
    #: Cores a host build may use; None: not a host build (no threads dimension).
    host_cores: int | None
    #: The threads the current plan runs with (the comparison's default).
    current_threads: int | None = None
    dimensions: tuple[str, ...] = DIMENSIONS


def current_candidate(space: TuneSpace) -> Candidate:
    plan = plan_launch(space.request)
    predicted, quality = _predict(space, plan)
    return Candidate(name="current plan", dimension=None, changes={},
                     threads=space.current_threads, plan=plan, differs=(),
                     predicted_tps=predicted, quality=quality)


def plan_candidates(space: TuneSpace) -> tuple[Candidate, tuple[Candidate, ...]]:
    """The current plan, and every alternative ranked best first (pruned ones last,
    each with its reason)."""
    current = current_candidate(space)
    found: list[Candidate] = []
    for dimension in space.dimensions:
        for proposal in _GENERATORS[dimension](space, current.plan):
            found.append(_candidate(space, current, dimension, proposal))
    order = {d: i for i, d in enumerate(DIMENSIONS)}
    ranked = sorted(
        (c for c in found if c.pruned is None),
        key=lambda c: (-(c.score if c.score is not None else 0.0),
                       order[c.dimension or KV]))
    return current, (*ranked, *(c for c in found if c.pruned is not None))


def _candidate(space: TuneSpace, current: Candidate, dimension: str,
               proposal: Proposal) -> Candidate:
    name, changes, threads, spec_type, avoid = proposal
    request = replace(space.request, per_call={**space.request.per_call, **changes},
                      avoid_offload=space.request.avoid_offload | avoid)
    if spec_type is not None:
        request = replace(request, explicit_spec_type=spec_type)
    plan = plan_launch(request)
    predicted, quality = _predict(space, plan)
    differs = _differs(current, plan, threads)
    pruned = _pruned(current.plan, plan, changes, quality, differs,
                     moves_weights=dimension == OFFLOAD)
    if pruned is None and spec_type is not None:
        pruned = _speculation_refused(plan, spec_type)
    return Candidate(name=name, dimension=dimension, changes=dict(changes), threads=threads,
                     plan=plan, differs=differs, predicted_tps=predicted, quality=quality,
                     pruned=pruned, spec_type=spec_type, avoid_offload=avoid)


def _speculation_refused(plan: LaunchPlan, spec_type: str) -> str | None:
    """Why the planner did not plan the speculation asked for, or None when it did."""
    got = plan.spec.spec_type
    if spec_type == NO_SPEC:
        return None if got is None else f"the planner still speculates ({got})"
    if got == spec_type:
        return None
    return ("the planner does not speculate with it: "
            + ("; ".join(plan.drafter.reasons) or "no drafter for this model"))


def _predict(space: TuneSpace, plan: LaunchPlan) -> tuple[float | None, float | None]:
    spec = plan.spec
    k, v = spec.cache_type_k or "f16", spec.cache_type_v or "f16"
    quality = pair_quality(space.weights, k, v)
    if isinstance(space.bandwidths, str):
        return None, quality
    try:
        predictions = predict_plan(plan, space.request.model, space.bandwidths,
                                   kv_read_cost=pair_read_cost(space.weights, k, v))
    except ValueError:
        return None, quality  # a model without per-block bytes: no prediction
    return (predictions[-1].tokens_per_s if predictions else None), quality


def _pruned(current: LaunchPlan, plan: LaunchPlan, changes: Mapping[str, object],
            quality: float | None, differs: tuple[str, ...], *,
            moves_weights: bool = False) -> str | None:
    if plan.unsupported:
        return "the build lacks " + ", ".join(plan.unsupported)
    for name, wanted in changes.items():
        got = getattr(plan.spec, name)
        if getattr(got, "value", got) != wanted:
            return f"the planner sets {name} to {got!r}, not {wanted!r}: " + (
                "; ".join(w.message for w in plan.warnings if w.field == name)
                or "a layer above the per-call overrides (environment) decides it")
    if quality is None:
        return (f"cache types {plan.spec.cache_type_k}/{plan.spec.cache_type_v} have no "
                "quality weight (configs/gpu/kv_quality.json)")
    if not moves_weights and (_gpu_layers(plan) < _gpu_layers(current)
                              or _host_share(plan) > _host_share(current)):
        return "it does not fit where the current plan does (weights leave the GPU)"
    if not differs:
        return "the plan it gives is the current plan"
    return None


def _gpu_layers(plan: LaunchPlan) -> int:
    layers = plan.spec.n_gpu_layers
    return 1 << 30 if layers is None else layers


def _host_share(plan: LaunchPlan) -> int:
    spec = plan.spec
    return (1 << 30 if spec.cpu_moe else 0) + (spec.n_cpu_moe or 0) + (spec.n_cpu_ffn or 0)


#: The fields a candidate's table row compares with the current plan.
COMPARED = ("cache_type_k", "cache_type_v", "flash_attn", "batch_size", "ubatch_size",
            "parallel", "ctx_size", "n_gpu_layers", "n_cpu_moe", "cpu_moe", "n_cpu_ffn",
            "spec_type", "drafter")


def _differs(current: Candidate, plan: LaunchPlan, threads: int | None) -> tuple[str, ...]:
    said = []
    for name in COMPARED:
        old, new = getattr(current.plan.spec, name), getattr(plan.spec, name)
        if old != new:
            said.append(f"{name} {_plain(old)} -> {_plain(new)}")
    if threads is not None and threads != current.threads:
        said.append(f"threads {_plain(current.threads)} -> {threads}")
    return tuple(said)


def _plain(value: object) -> str:
    value = getattr(value, "value", value)
    return "default" if value is None else str(value)


# --- the dimensions -------------------------------------------------------------------

class Proposal(NamedTuple):
    name: str
    #: Per-call settings over the current plan's request.
    changes: dict[str, object]
    threads: int | None = None
    #: The request's explicit spec type (``none``: no speculation); None: unchanged.
    spec_type: str | None = None
    #: Offload kinds the plan must avoid (its planner substitutes another).
    avoid_offload: frozenset[OffloadKind] = frozenset()


def _kv_types(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    caps = space.request.capabilities
    current = (plan.spec.cache_type_k or "f16", plan.spec.cache_type_v or "f16")
    out: list[Proposal] = []
    for name in space.weights:
        if caps.cache_types_k and name not in caps.cache_types_k:
            continue
        if caps.cache_types_v and name not in caps.cache_types_v:
            continue
        if (name, name) != current:
            out.append(Proposal(f"kv {name}", {"cache_type_k": name, "cache_type_v": name}))
    return out


def _flash_attn(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    current = _plain(plan.spec.flash_attn)
    return [Proposal(f"flash-attn {mode}", {"flash_attn": mode})
            for mode in ("on", "off") if mode != current]


def _batch(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    batch = plan.spec.batch_size or DEFAULT_BATCH
    ubatch = plan.spec.ubatch_size or DEFAULT_UBATCH
    out: list[Proposal] = []
    for size in UBATCH_SIZES:
        if size == ubatch:
            continue
        wanted_batch = max(batch, size)
        out.append(Proposal(f"ubatch {size}",
                            {"batch_size": wanted_batch, "ubatch_size": size}))
    return out


def _threads(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    cores = space.host_cores
    if cores is None:
        return []
    current = space.current_threads or cores
    values = sorted({max(1, cores // 2), max(1, cores - 1), cores} - {current})
    return [Proposal(f"threads {n}", {}, n) for n in values]


def _slots(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    current = plan.spec.parallel or 1
    values = sorted({1, current * 2} - {current})
    return [Proposal(f"slots {n}", {"parallel": n}) for n in values]


def _drafter(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    if plan.spec.spec_type is not None:
        return [Proposal(f"drafter off (was {plan.spec.spec_type})", {}, spec_type=NO_SPEC)]
    request = space.request
    drafter_file = request.bundle.drafter_path if request.bundle else None
    if request.model.has_mtp_head or (
            request.drafter_model is not None and request.drafter_model.has_mtp_head):
        return [Proposal(f"drafter on ({DRAFT_MTP})", {}, spec_type=DRAFT_MTP)]
    if drafter_file is not None:
        return [Proposal(f"drafter on ({DRAFT_SIMPLE})", {}, spec_type=DRAFT_SIMPLE)]
    return []  # nothing to draft with


#: Each split's alternatives, as the kinds to avoid: the planner's own substitutes.
_OTHER_SPLITS: Mapping[OffloadKind, tuple[tuple[str, frozenset[OffloadKind]], ...]] = {
    OffloadKind.N_CPU_MOE: (
        ("offload --cpu-moe", frozenset({OffloadKind.N_CPU_MOE})),
        ("offload whole layers", frozenset({OffloadKind.N_CPU_MOE, OffloadKind.CPU_MOE}))),
    OffloadKind.CPU_MOE: (("offload whole layers", frozenset({OffloadKind.CPU_MOE})),),
    OffloadKind.N_CPU_FFN: (("offload whole layers", frozenset({OffloadKind.N_CPU_FFN})),),
}


def _offload(space: TuneSpace, plan: LaunchPlan) -> list[Proposal]:
    """Where the model does not fit: the other ways to split it (none where it fits)."""
    if plan.offload is None:
        return []
    return [Proposal(name, {}, avoid_offload=avoid)
            for name, avoid in _OTHER_SPLITS.get(plan.offload.kind, ())]


_GENERATORS: Mapping[str, Callable[[TuneSpace, LaunchPlan], list[Proposal]]] = {
    KV: _kv_types, FLASH_ATTN: _flash_attn, BATCH: _batch, THREADS: _threads, SLOTS: _slots,
    DRAFTER: _drafter, OFFLOAD: _offload,
}


def parse_dimensions(text: Sequence[str]) -> tuple[str, ...]:
    """``--vary`` words (comma lists allowed) in :data:`DIMENSIONS`' order; raises
    ValueError naming a word that is not a dimension."""
    words = {w.strip() for item in text for w in item.split(",") if w.strip()}
    unknown = sorted(words - set(DIMENSIONS))
    if unknown:
        raise ValueError(f"{', '.join(unknown)}: not a dimension; allowed: "
                         + ", ".join(DIMENSIONS))
    return tuple(d for d in DIMENSIONS if d in words) if words else DIMENSIONS
