"""A winner as a card's ``tuned`` entry (pure; ``harness tune --write`` writes it).

The entry holds the settings the winner changed and its provenance: when it was
measured, on which build and hardware, the candidate, the values it replaces and the
evidence (each figure's verdict with its ratio and interval). Its key is the bundle (or
``model:ARCH``) and the context the plan ran at (planning/tuned_layer.py), so the planner
layers it exactly where it was measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from harness.planning.tuned_layer import context_key, model_class
from harness.results.run_record import Hardware
from harness.tune.candidates import Candidate
from harness.tune.tune_record import figures_json
from harness.tune.winner import Measured


def not_writable(winner: Measured) -> str | None:
    """Why a winner cannot go into a card, or None when it can."""
    if winner.candidate.avoid_offload:
        return (f"{winner.candidate.name} changes where weights go, which the planner "
                "decides from the model's sizes and the card's VRAM, not a card setting: "
                "the measured figures are the evidence to change that rule")
    if winner.candidate.spec_type is not None:
        return (f"{winner.candidate.name} changes speculation, which a card does not set: "
                "it is the bundle's (its catalog entry's spec_type) or the launch's — "
                "change it there")
    if not winner.candidate.changes:
        return (f"{winner.candidate.name} changes no card setting (threads are the "
                "launcher's, not the card's): set it where the server is started")
    return None


def tuned_key(current: Candidate, architecture: str) -> tuple[str, str]:
    """(bundle id or ``model:ARCH``, context) the current plan's entry goes under;
    ``architecture``: the model's GGUF architecture."""
    plan = current.plan
    what = plan.catalog.id.lower() if plan.catalog else model_class(architecture)
    # The context the planner looks the entry up at: the card's, bundle's or call's.
    return what, context_key(plan.tune.settings.ctx_size)


def tuned_entry(winner: Measured, current: Candidate, *, build_key: str, hardware: Hardware,
                measured_at: str, threshold: float) -> dict[str, Any]:
    """The ``tuned`` entry of ``winner`` (JSON-ready)."""
    changes = dict(winner.candidate.changes)
    return {
        "settings": changes,
        "provenance": {
            "_provenance": "measured",
            "measured": measured_at,
            "build_key": build_key,
            "candidate": winner.candidate.name,
            "hardware": {"host": hardware.host, "cpu": hardware.cpu, "gpu": hardware.gpu,
                         "vram_mib": hardware.vram_mib},
            "replaces": {name: _plain(getattr(current.plan.spec, name)) for name in changes},
            "threshold": threshold,
            "evidence": figures_json(winner.decisions),
        },
    }


def with_tuned(config: Mapping[str, Any], key: str, ctx: str,
               entry: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a card's JSON object) with ``tuned[key][ctx]`` set to ``entry``; every
    other entry kept. A tune of a plan that already had an entry there started from it,
    so the earlier winner's settings stay unless this one changes them."""
    updated = dict(config)
    tuned = {k: dict(v) for k, v in config.get("tuned", {}).items()}
    earlier = tuned.get(key, {}).get(ctx, {}).get("settings", {})
    tuned.setdefault(key, {})[ctx] = {**entry, "settings": {**earlier, **entry["settings"]}}
    updated["tuned"] = tuned
    return updated


def _plain(value: object) -> object:
    return getattr(value, "value", value)
