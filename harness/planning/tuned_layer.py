"""Which ``tuned`` entry of a card a launch gets (pure; ``harness tune --write`` writes them).

An entry is keyed by what was tuned — the bundle's id, the bundle class its card
recommendation is under, or ``model:ARCHITECTURE`` for a bare model — and by the
context it was measured at (the plan's ``--ctx-size``; ``default`` for a plan that
sets none). A launch gets the entry of its own key and context only: settings measured
at 8192 tokens say nothing of 131072, so no other context borrows them.
"""

from __future__ import annotations

from harness.facts.gpu import GpuConfig, TunedSettings

DEFAULT_CONTEXT = "default"


def model_class(architecture: str) -> str:
    """The key a bare model's tune is kept under: its GGUF architecture."""
    return f"model:{architecture}"


def context_key(ctx_size: int | None) -> str:
    return DEFAULT_CONTEXT if ctx_size is None else str(ctx_size)


def tuned_keys(bundle_id: str | None, bundle_key: str | None,
               model: str | None) -> tuple[str, ...]:
    """The keys a launch looks under, most specific first."""
    keys = [k for k in (bundle_id.lower() if bundle_id else None, bundle_key) if k]
    if not keys and model:
        keys.append(model)
    return tuple(dict.fromkeys(keys))


def find_tuned(config: GpuConfig, keys: tuple[str, ...],
               ctx_size: int | None) -> tuple[str, TunedSettings] | None:
    """The first key's entry at ``ctx_size``, with the key; None without one."""
    wanted = context_key(ctx_size)
    for key in keys:
        entry = config.tuned.get((key, wanted))
        if entry is not None:
            return key, entry
    return None
