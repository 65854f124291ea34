"""A tune as the run record's ``tune`` object (pure), as the run.json schema's ``tune``
describes it: the card and the key and context it was tuned for, whether the card is
stale (a candidate beat its plan), the current plan's compared fields, the winner's
figures, and every candidate's verdict and figures."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.ab.decision import MetricDecision
from harness.tune.candidates import COMPARED, Candidate
from harness.tune.winner import Measured, TuneVerdict


def figures_json(decisions: Sequence[MetricDecision]) -> list[dict[str, Any]]:
    return [{"metric": d.metric, "verdict": d.verdict.value,
             "ratio": None if d.interval is None else round(d.interval.ratio, 6),
             "low": None if d.interval is None else round(d.interval.low, 6),
             "high": None if d.interval is None else round(d.interval.high, 6),
             "pairs": d.pairs} for d in decisions]


def current_fields(current: Candidate) -> list[str]:
    """The current plan's compared fields as ``name value`` (set ones only)."""
    said = []
    for name in COMPARED:
        value = getattr(current.plan.spec, name)
        if value is not None:
            said.append(f"{name} {getattr(value, 'value', value)}")
    if current.threads is not None:
        said.append(f"threads {current.threads}")
    return said


def record_json(current: Candidate, ranked: Sequence[Candidate], measured: Sequence[Measured],
                verdict: TuneVerdict, *, card: str, key: str, context: str, build_key: str,
                check: bool, threshold: float) -> dict[str, Any]:
    by_name = {m.candidate.name: m for m in measured}
    candidates = []
    for candidate in ranked:
        found = by_name.get(candidate.name)
        state = (f"pruned: {candidate.pruned}" if candidate.pruned is not None
                 else "not measured" if found is None
                 else f"failed: {found.error.splitlines()[0][:900]}" if found.error
                 else found.verdict)
        candidates.append({"name": candidate.name, "differs": list(candidate.differs),
                           "verdict": state,
                           "figures": figures_json(found.decisions) if found else []})
    winner = verdict.winner
    return {
        "card": card, "key": key, "context": context, "build_key": build_key,
        "check": check, "threshold": threshold, "stale": winner is not None,
        "current": current_fields(current),
        "winner": None if winner is None else {
            "name": winner.candidate.name, "differs": list(winner.candidate.differs),
            "figures": figures_json(winner.decisions)},
        "candidates": candidates, "summary": verdict.summary,
    }
