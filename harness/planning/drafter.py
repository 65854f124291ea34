"""Whether a launch speculates, with which drafter, and why not when it doesn't (pure).

Ported behaviour (reference 002, docs/references.md):
- the spec type comes from an explicit setting, else the catalog entry, else
  ``draft-mtp`` when the model (or its companion drafter file) carries an MTP head; a
  ``draft-mtp`` request for a model without one is dropped, because the server exits
  with ``failed to create MTP context`` (docs/design.md, measured);
- a drafter the *catalog* chose is left out when, beside it, the target context or its
  KV precision would shrink, or the model, its KV and the drafter would not fit the free
  VRAM: a drafter buys speed, context is what a session runs out of. A drafter the user
  named explicitly is kept; the user asked for it;
- a drafter that broke a start is remembered per (build, drafter file) and left out of
  the retry and every later launch of that pair;
- ``draft-mtp`` limits the launch to one slot (not reliable with ``--parallel`` > 1).
"""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

DRAFT_MTP = "draft-mtp"
DRAFT_SIMPLE = "draft-simple"
_MIB = 1024 * 1024


@dataclass(frozen=True)
class KvOutcome:
    """What the fitter settled on for the target model: context and KV cache types."""

    ctx_size: int
    cache_type_k: str
    cache_type_v: str


@dataclass(frozen=True)
class DrafterInputs:
    explicit_spec_type: str | None
    catalog_spec_type: str | None
    #: A drafter file: the catalog's companion or one the user named.
    drafter_path: str | None
    drafter_is_explicit: bool
    model_has_mtp: bool
    drafter_has_mtp: bool
    build_key: str
    broken: Set[tuple[str, str]]
    slots: int
    #: The fitted target with the drafter resident and without it.
    with_drafter: KvOutcome | None = None
    without_drafter: KvOutcome | None = None
    #: Model + KV + drafter bytes on the GPU, and the free VRAM (None: no GPU to fit).
    resident_bytes_with_drafter: int = 0
    free_vram_bytes: int | None = None
    #: The card's spec type for the build's backend (``spec_by_backend``), and the card.
    card_spec_type: str | None = None
    card_name: str = ""


@dataclass(frozen=True)
class DrafterDecision:
    spec_type: str | None
    drafter_path: str | None
    slots: int
    left_out: bool
    reasons: tuple[str, ...]


class BrokenDrafters:
    """Drafters that broke a start, keyed by (build key, drafter file).

    The launch supervisor adds to it; planners read a snapshot (``snapshot()``).
    """

    def __init__(self) -> None:
        self._keys: set[tuple[str, str]] = set()

    def mark(self, build_key: str, drafter_path: str) -> None:
        self._keys.add((build_key, drafter_path))

    def snapshot(self) -> frozenset[tuple[str, str]]:
        return frozenset(self._keys)


def decide_drafter(inputs: DrafterInputs) -> DrafterDecision:
    reasons: list[str] = []
    spec_type = _spec_type(inputs, reasons)
    drafter = inputs.drafter_path if spec_type else None
    if spec_type == DRAFT_MTP:
        drafter = _mtp_drafter(inputs, reasons)
    left_out = False
    if drafter is not None:
        cost = _drafter_cost(inputs, drafter)
        if cost:
            reasons.append(f"leaving the drafter {drafter} out: {cost}")
            left_out = True
            drafter = None
            if spec_type != DRAFT_MTP or not inputs.model_has_mtp:
                spec_type = None
    slots = inputs.slots
    if spec_type == DRAFT_MTP and slots > 1:
        reasons.append(f"draft-mtp: limiting {slots} slots to 1 (draft-mtp is not reliable "
                       "with --parallel > 1)")
        slots = 1
    return DrafterDecision(spec_type, drafter, slots, left_out, tuple(reasons))


def _spec_type(inputs: DrafterInputs, reasons: list[str]) -> str | None:
    has_head = inputs.model_has_mtp or inputs.drafter_has_mtp
    if inputs.explicit_spec_type:
        chosen, source = inputs.explicit_spec_type, "set explicitly"
    elif inputs.card_spec_type:
        chosen, source = inputs.card_spec_type, f"from {inputs.card_name} for this backend"
    elif inputs.catalog_spec_type:
        chosen, source = inputs.catalog_spec_type, "from the catalog entry"
    elif has_head:
        reasons.append("spec type draft-mtp: the model carries an MTP head")
        return DRAFT_MTP
    else:
        return None
    if chosen == DRAFT_MTP and not has_head:
        reasons.append(f"spec type draft-mtp ({source}) dropped: neither the model nor its "
                       "drafter has an MTP head (nextn_predict_layers = 0), and the server "
                       "would exit with 'failed to create MTP context'")
        return None
    if chosen in ("none", ""):
        return None
    reasons.append(f"spec type {chosen} ({source})")
    return chosen


def _mtp_drafter(inputs: DrafterInputs, reasons: list[str]) -> str | None:
    # A model that carries its own head must not be given --spec-draft-model: MTP would
    # load the named file instead of the model's own head.
    if inputs.model_has_mtp:
        if inputs.drafter_path:
            reasons.append("draft-mtp runs the model's own MTP head; the drafter file "
                           f"{inputs.drafter_path} is not passed")
        return None
    return inputs.drafter_path


def _drafter_cost(inputs: DrafterInputs, drafter: str) -> str | None:
    if (inputs.build_key, drafter) in inputs.broken:
        return f"it broke an earlier start of build {inputs.build_key}"
    if inputs.drafter_is_explicit:
        return None
    with_d, without = inputs.with_drafter, inputs.without_drafter
    if with_d is not None and without is not None and (
        with_d.ctx_size < without.ctx_size
        or (with_d.cache_type_k, with_d.cache_type_v)
        != (without.cache_type_k, without.cache_type_v)
    ):
        return (f"beside it the target would get {with_d.ctx_size} tokens with "
                f"{with_d.cache_type_k}/{with_d.cache_type_v} KV instead of "
                f"{without.ctx_size} tokens with {without.cache_type_k}/"
                f"{without.cache_type_v}")
    if (inputs.free_vram_bytes is not None
            and inputs.resident_bytes_with_drafter > inputs.free_vram_bytes):
        return (f"beside it the model needs {inputs.resident_bytes_with_drafter / _MIB:.0f} "
                f"MiB of GPU memory and {inputs.free_vram_bytes / _MIB:.0f} MiB is free")
    return None
