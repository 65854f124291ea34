"""The tune's table and its JSON (pure: candidates and comparisons in, rows out)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.table import Table

from harness.ab.decision import MetricDecision
from harness.tune.candidates import Candidate
from harness.tune.tune_measure import TUNE_METRICS
from harness.tune.winner import Measured, TuneVerdict


def _figure(decision: MetricDecision | None) -> str:
    if decision is None:
        return ""
    interval = decision.interval
    if interval is None:
        return decision.verdict.value
    return (f"{interval.ratio:.3f} [{interval.low:.3f}, {interval.high:.3f}] "
            f"{decision.verdict.value}")


def _predicted(candidate: Candidate) -> str:
    return "" if candidate.predicted_tps is None else f"{candidate.predicted_tps:.1f}"


def _quality(candidate: Candidate) -> str:
    return "" if candidate.quality is None else f"{candidate.quality:g}"


def tune_table(current: Candidate, ranked: Sequence[Candidate],
               measured: Sequence[Measured], metrics: Sequence[str] = TUNE_METRICS) -> Table:
    """One row per candidate in rank order: what differs, the prediction, the weight,
    each figure's ratio (candidate / current) with its interval and verdict, the
    verdict; the current plan first, pruned candidates last with their reason."""
    by_name = {m.candidate.name: m for m in measured}
    table = Table(title="harness tune: candidates against the current plan")
    for column in ("#", "candidate", "differs", "predicted t/s", "quality", *metrics,
                   "verdict", "s"):
        table.add_column(column, overflow="fold")
    table.add_row("", current.name, "", _predicted(current), _quality(current),
                  *("1" for _ in metrics), "reference", "")
    for rank, candidate in enumerate(ranked, start=1):
        found = by_name.get(candidate.name)
        decisions = {d.metric: d for d in found.decisions} if found else {}
        if candidate.pruned is not None:
            verdict = f"pruned: {candidate.pruned}"
        elif found is None:
            verdict = "not measured (budget or --top)"
        elif found.error is not None:
            verdict = f"failed: {found.error.splitlines()[0]}"
        else:
            verdict = found.verdict
        table.add_row(str(rank) if candidate.pruned is None else "-", candidate.name,
                      "; ".join(candidate.differs), _predicted(candidate), _quality(candidate),
                      *(_figure(decisions.get(m)) for m in metrics), verdict,
                      f"{found.elapsed_s:.0f}" if found else "")
    return table


def _decision_json(decision: MetricDecision) -> dict[str, Any]:
    interval = decision.interval
    return {"metric": decision.metric, "verdict": decision.verdict.value,
            "ratio": None if interval is None else interval.ratio,
            "low": None if interval is None else interval.low,
            "high": None if interval is None else interval.high,
            "pairs": decision.pairs, "threshold": decision.threshold,
            "baseline_median": decision.baseline_median,
            "candidate_median": decision.candidate_median, "reason": decision.reason}


def _candidate_json(candidate: Candidate, binary: str) -> dict[str, Any]:
    return {"name": candidate.name, "dimension": candidate.dimension,
            "changes": dict(candidate.changes), "threads": candidate.threads,
            "spec_type": candidate.spec_type,
            "avoid_offload": sorted(k.value for k in candidate.avoid_offload),
            "differs": list(candidate.differs),
            "predicted_tps": candidate.predicted_tps,
            "quality": candidate.quality, "score": candidate.score,
            "pruned": candidate.pruned,
            "argv": candidate.plan.to_argv(binary, "127.0.0.1", 0)}


def tune_json(current: Candidate, ranked: Sequence[Candidate], measured: Sequence[Measured],
              verdict: TuneVerdict, *, binary: str, meta: dict[str, Any]) -> dict[str, Any]:
    """Everything the tune saw: each candidate, each comparison with every sample."""
    by_name = {m.candidate.name: m for m in measured}
    rows = []
    for candidate in ranked:
        found = by_name.get(candidate.name)
        rows.append({**_candidate_json(candidate, binary), "measured": None if found is None
                     else {"verdict": found.verdict, "error": found.error,
                           "elapsed_s": found.elapsed_s,
                           "decisions": [_decision_json(d) for d in found.decisions],
                           "samples": list(found.samples)}})
    return {**meta, "current": _candidate_json(current, binary), "candidates": rows,
            "winner": verdict.winner.candidate.name if verdict.winner else None,
            "holds": verdict.holds, "summary": verdict.summary}
