"""VRAM fitting (pure): how many slots fit at a context, how much context fits for N slots.

Reference 001's budget (docs/references.md): the KV cache gets what is left of the card's
memory after the reserved headroom (driver, activations), the model weights and the
drafter. Per slot the KV costs ``context x bytes per token``; the caller computes the
bytes per token for the model and cache types (a KV sizer's job) and passes a plain int.

Contexts are per slot. llama-server's ``--ctx-size`` is the pool all slots share, so a
result also gives ``ctx_size = slots x ctx_per_slot``. llama.cpp pads contexts up to a
multiple of 256 (``GGML_PAD(n_ctx, 256)`` in src/llama-context.cpp): a context asked for
is priced at its padded size, and a context found is rounded down to a multiple of 256
so the padding never pushes it past the budget.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from harness.errors import ConfigError

MIB = 1024 * 1024
GIB = 1024 * MIB

#: llama.cpp's KV padding: n_ctx and n_ctx_seq are padded up to this many tokens.
KV_PAD_TOKENS = 256


class Limit(enum.StrEnum):
    """What stopped the fit from going further."""

    VRAM = "vram"
    PARALLEL_CAP = "parallel-cap"
    CONTEXT_CAP = "context-cap"
    NO_BUDGET = "no-budget"


@dataclass(frozen=True)
class FitInputs:
    """Sizes in, all plain numbers. Caps come from the card config's ``fit_caps``."""

    vram_mib: int
    reserved_headroom_mib: int
    weights_bytes: int
    drafter_bytes: int
    #: KV bytes one token costs in one slot (K and V, every layer that owns a cache).
    kv_bytes_per_token: int
    max_parallel: int
    max_ctx_size: int

    def __post_init__(self) -> None:
        for name in ("vram_mib", "reserved_headroom_mib", "weights_bytes", "drafter_bytes",
                     "kv_bytes_per_token"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"fitting input {name}={value!r} is not allowed; "
                                  "allowed: an integer >= 0")
        for name in ("max_parallel", "max_ctx_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"fitting cap {name}={value!r} is not allowed; "
                                  "allowed: an integer >= 1")

    @property
    def kv_budget_bytes(self) -> int:
        """What is left for the KV cache; negative when even the weights do not fit."""
        return (self.vram_mib * MIB - self.reserved_headroom_mib * MIB
                - self.weights_bytes - self.drafter_bytes)

    def budget_text(self) -> str:
        return (f"KV budget {_gib(self.kv_budget_bytes)} = {_gib(self.vram_mib * MIB)} VRAM"
                f" - {_gib(self.reserved_headroom_mib * MIB)} headroom"
                f" - {_gib(self.weights_bytes)} weights - {_gib(self.drafter_bytes)} drafter")


@dataclass(frozen=True)
class Fit:
    """A fitting answer; ``slots`` or ``ctx_per_slot`` is 0 when nothing fits."""

    slots: int
    ctx_per_slot: int
    #: What ``--ctx-size`` must be for every slot to get ``ctx_per_slot`` tokens.
    ctx_size: int
    kv_bytes: int
    budget_bytes: int
    limited_by: Limit
    reason: str

    @property
    def fits(self) -> bool:
        return self.slots >= 1 and self.ctx_per_slot >= KV_PAD_TOKENS


def max_slots_at(inputs: FitInputs, ctx_per_slot: int) -> Fit:
    """The most slots whose KV fits when each slot holds ``ctx_per_slot`` tokens."""
    if isinstance(ctx_per_slot, bool) or not isinstance(ctx_per_slot, int) or ctx_per_slot < 1:
        raise ConfigError(f"context per slot {ctx_per_slot!r} is not allowed; "
                          "allowed: an integer >= 1")
    ctx = pad_context(ctx_per_slot)
    padded = f" (padded up from {ctx_per_slot})" if ctx != ctx_per_slot else ""
    budget = inputs.kv_budget_bytes
    if ctx > inputs.max_ctx_size:
        return _nothing(inputs, Limit.CONTEXT_CAP, ctx,
                        f"0 slots: {ctx} tokens per slot{padded} is above the card's "
                        f"max_ctx_size {inputs.max_ctx_size}")
    if budget <= 0:
        return _nothing(inputs, Limit.NO_BUDGET, ctx,
                        f"0 slots: nothing left for the KV cache: {inputs.budget_text()}")
    per_slot = ctx * inputs.kv_bytes_per_token
    if per_slot == 0:
        slots, limit = inputs.max_parallel, Limit.PARALLEL_CAP
        why = "the KV cache costs nothing per token"
    else:
        by_vram = budget // per_slot
        slots = min(by_vram, inputs.max_parallel)
        limit = Limit.PARALLEL_CAP if by_vram > inputs.max_parallel else Limit.VRAM
        why = (f"{inputs.budget_text()}; {_gib(per_slot)} per slot ({ctx} tokens{padded} x "
               f"{inputs.kv_bytes_per_token} B) -> {by_vram} slots by VRAM")
    cap = f", capped at max_parallel {inputs.max_parallel}" if limit is Limit.PARALLEL_CAP else ""
    return Fit(slots=slots, ctx_per_slot=ctx, ctx_size=slots * ctx,
               kv_bytes=slots * per_slot, budget_bytes=budget, limited_by=limit,
               reason=f"{slots} slots at {ctx} tokens: {why}{cap}")


def max_context_at(inputs: FitInputs, slots: int) -> Fit:
    """The longest per-slot context (a multiple of 256) whose KV fits ``slots`` slots."""
    if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
        raise ConfigError(f"slot count {slots!r} is not allowed; allowed: an integer >= 1")
    budget = inputs.kv_budget_bytes
    if slots > inputs.max_parallel:
        return _nothing(inputs, Limit.PARALLEL_CAP, 0,
                        f"no context: {slots} slots is above the card's max_parallel "
                        f"{inputs.max_parallel}", slots=slots)
    if budget <= 0:
        return _nothing(inputs, Limit.NO_BUDGET, 0,
                        f"no context: nothing left for the KV cache: {inputs.budget_text()}",
                        slots=slots)
    cap = floor_context(inputs.max_ctx_size)
    if inputs.kv_bytes_per_token == 0:
        ctx, limit = cap, Limit.CONTEXT_CAP
        why = "the KV cache costs nothing per token"
    else:
        by_vram = budget // (slots * inputs.kv_bytes_per_token)
        ctx = min(floor_context(by_vram), cap)
        limit = Limit.CONTEXT_CAP if floor_context(by_vram) > cap else Limit.VRAM
        why = (f"{inputs.budget_text()}; {slots} slots x {inputs.kv_bytes_per_token} B per "
               f"token -> {by_vram} tokens per slot by VRAM, {floor_context(by_vram)} after "
               f"rounding down to a multiple of {KV_PAD_TOKENS}")
    if ctx < KV_PAD_TOKENS:
        return _nothing(inputs, Limit.VRAM, 0,
                        f"no context: fewer than {KV_PAD_TOKENS} tokens per slot fit; {why}",
                        slots=slots)
    capped = f", capped at max_ctx_size {cap}" if limit is Limit.CONTEXT_CAP else ""
    return Fit(slots=slots, ctx_per_slot=ctx, ctx_size=slots * ctx,
               kv_bytes=slots * ctx * inputs.kv_bytes_per_token, budget_bytes=budget,
               limited_by=limit,
               reason=f"{ctx} tokens per slot for {slots} slots: {why}{capped}")


def pad_context(tokens: int) -> int:
    """``tokens`` padded up to llama.cpp's 256-token multiple (what the server allocates)."""
    return -(-tokens // KV_PAD_TOKENS) * KV_PAD_TOKENS


def floor_context(tokens: int) -> int:
    """``tokens`` rounded down to a multiple of 256 (so padding cannot grow it)."""
    return max(0, tokens) // KV_PAD_TOKENS * KV_PAD_TOKENS


def _nothing(inputs: FitInputs, limit: Limit, ctx: int, reason: str, slots: int = 0) -> Fit:
    return Fit(slots=slots, ctx_per_slot=ctx, ctx_size=0, kv_bytes=0,
               budget_bytes=inputs.kv_budget_bytes, limited_by=limit, reason=reason)


def _gib(size: int) -> str:
    return f"{size / GIB:.2f} GiB"
