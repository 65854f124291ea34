"""The JSON shapes the read endpoints answer with, built from run records and summaries
(no I/O)."""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from typing import Any

from harness.results.run_record import Figure, FigureKey, Outcome, RunRecord
from harness.results.run_summary import RunSummary


def outcome_counts(run: RunRecord) -> dict[str, int]:
    return counts_by_word(Counter(o.outcome.value for o in run.outcomes))


def counts_by_word(counts: Mapping[str, int]) -> dict[str, int]:
    """Every outcome's count by its word, and ``total``."""
    # Every Outcome, so a count of zero is shown rather than left out (a record holds no
    # other: the schema refuses any other word).
    found = {outcome.value: counts.get(outcome.value, 0) for outcome in Outcome}
    found["total"] = sum(counts.values())
    return found


def hardware_summary(run: RunRecord | RunSummary) -> dict[str, str]:
    return {"identity": run.hardware.identity, "description": run.hardware.describe()}


def run_summary(run: RunSummary, report: dict[str, Any]) -> dict[str, Any]:
    """One line of ``GET /api/runs``."""
    return {
        "run_id": run.run_id,
        "branch": run.branch,
        "commit": run.commit,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "hardware": hardware_summary(run),
        "build": asdict(run.build),
        "outcomes": counts_by_word(run.outcome_counts),
        "report": report,
    }


def run_detail(run: RunRecord, report: dict[str, Any]) -> dict[str, Any]:
    """``GET /api/runs/{id}``: the whole record plus what the service adds to it."""
    return {"run": run.to_json(), "hardware": hardware_summary(run),
            "outcomes": outcome_counts(run), "report": report}


def figure_medians(figures: Iterable[Figure],
                   shapes: dict[FigureKey, tuple[str, dict[str, Any]]] | None = None,
                   ) -> list[dict[str, Any]]:
    """The median of each key + metric's figures (a test may record one several times).

    ``shapes`` keeps each key's label and JSON between calls: a history shows the same few
    dozen keys for each of up to a thousand runs.
    """
    known = {} if shapes is None else shapes
    grouped: dict[tuple[FigureKey, str], list[float]] = {}
    for figure in figures:
        grouped.setdefault((figure.key, figure.metric), []).append(figure.value)
    for key, _ in grouped:
        if key not in known:
            known[key] = (key.label(), asdict(key))
    return [
        {"key": known[key][1], "label": known[key][0], "metric": metric,
         "median": statistics.median(values), "samples": len(values)}
        for (key, metric), values in sorted(grouped.items(),
                                            key=lambda item: (known[item[0][0]][0], item[0][1]))
    ]


def history(branch: str, hardware: str, runs_newest_first: Sequence[RunSummary],
            figures: Mapping[str, Sequence[Figure]],
            reports: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """``GET /api/history``: one branch on one hardware, oldest run first, with the
    medians of each run's ``figures`` (by run id)."""
    described = runs_newest_first[0].hardware.describe() if runs_newest_first else None
    shapes: dict[FigureKey, tuple[str, dict[str, Any]]] = {}
    return {
        "branch": branch,
        "hardware": {"identity": hardware, "description": described},
        "runs": [
            {"run_id": run.run_id, "commit": run.commit, "started_at": run.started_at,
             "build": asdict(run.build), "outcomes": counts_by_word(run.outcome_counts),
             "figures": figure_medians(figures.get(run.run_id, ()), shapes),
             "report": reports.get(run.run_id, {})}
            for run in reversed(runs_newest_first)
        ],
    }
