"""The JSON shapes the read endpoints answer with, built from run records (no I/O)."""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import asdict
from typing import Any

from harness.results.run_record import FigureKey, Outcome, RunRecord


def outcome_counts(run: RunRecord) -> dict[str, int]:
    # Every Outcome, so a count of zero is shown rather than left out (a record holds no
    # other: the schema refuses any other word).
    counts = Counter(o.outcome for o in run.outcomes)
    found = {outcome.value: counts.get(outcome, 0) for outcome in Outcome}
    found["total"] = len(run.outcomes)
    return found


def hardware_summary(run: RunRecord) -> dict[str, str]:
    return {"identity": run.hardware.identity, "description": run.hardware.describe()}


def run_summary(run: RunRecord, report: dict[str, Any]) -> dict[str, Any]:
    """One line of ``GET /api/runs``."""
    return {
        "run_id": run.run_id,
        "branch": run.branch,
        "commit": run.commit,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "hardware": hardware_summary(run),
        "build": asdict(run.build),
        "outcomes": outcome_counts(run),
        "report": report,
    }


def run_detail(run: RunRecord, report: dict[str, Any]) -> dict[str, Any]:
    """``GET /api/runs/{id}``: the whole record plus what the service adds to it."""
    return {"run": run.to_json(), "hardware": hardware_summary(run),
            "outcomes": outcome_counts(run), "report": report}


def figure_medians(run: RunRecord) -> list[dict[str, Any]]:
    """The median of each key + metric's figures (a test may record one several times)."""
    grouped: dict[tuple[FigureKey, str], list[float]] = {}
    for figure in run.figures:
        grouped.setdefault((figure.key, figure.metric), []).append(figure.value)
    return [
        {"key": asdict(key), "label": key.label(), "metric": metric,
         "median": statistics.median(values), "samples": len(values)}
        for (key, metric), values in sorted(grouped.items(),
                                            key=lambda item: (item[0][0].label(), item[0][1]))
    ]


def history(branch: str, hardware: str, runs_newest_first: list[RunRecord],
            reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``GET /api/history``: one branch on one hardware, oldest run first."""
    described = runs_newest_first[0].hardware.describe() if runs_newest_first else None
    return {
        "branch": branch,
        "hardware": {"identity": hardware, "description": described},
        "runs": [
            {"run_id": run.run_id, "commit": run.commit, "started_at": run.started_at,
             "build": asdict(run.build), "outcomes": outcome_counts(run),
             "figures": figure_medians(run), "report": reports.get(run.run_id, {})}
            for run in reversed(runs_newest_first)
        ],
    }
