"""Run records and report states as rows of the store's tables, and back (pure).

A run goes in as one ``runs`` row with its ``outcomes`` and ``figures`` rows and
comes back as the ``run.json`` body those rows make, which the store rebuilds through
the run schema. :class:`ReportState` is the other value the store keeps: where a run's
report stands, kept with the run so the results service stores both in one
transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from sqlalchemy import RowMapping

from harness.results.run_record import (
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    Outcome,
    RunRecord,
    TestOutcome,
)
from harness.results.run_summary import RunSummary
from harness.results.run_validation import run_from_checked_json
from harness.results.store_tables import KEY_FIELDS
from harness.results.test_ids import current_test_id

#: A report waits for the service's worker (pending), was made (ready) or could not be.
REPORT_STATES = frozenset({"pending", "ready", "failed"})


@dataclass(frozen=True)
class ReportState:
    """Where a run's report stands, as the results service records it."""

    #: One of :data:`REPORT_STATES`.
    state: str
    message: str | None = None
    problems: tuple[str, ...] = ()
    #: time.time_ns() when the report was queued: the worker takes the oldest first.
    queued_ns: int = 0
    updated_at: str = ""

    def __post_init__(self) -> None:
        if self.state not in REPORT_STATES:
            raise ValueError(f"report state {self.state!r} is not one of "
                             f"{', '.join(sorted(REPORT_STATES))}")
        if not 0 <= self.queued_ns < 2**63:
            raise ValueError(f"report queued_ns {self.queued_ns} is outside 0 to 2**63 - 1 "
                             "(a BIGINT); use time.time_ns()")


# -- records -> rows -----------------------------------------------------------

def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def run_row(run: RunRecord) -> dict[str, Any]:
    """The ``runs`` row of ``run``, which the caller has checked (add_run: check_run)."""
    return {
        "run_id": run.run_id, "branch": run.branch, "commit": run.commit,
        "started_at": run.started_at, "finished_at": run.finished_at,
        "hardware_identity": run.hardware.identity,
        "hardware": dumps(asdict(run.hardware)), "build": dumps(asdict(run.build)),
        "harness_version": run.harness_version, "labels": dumps(run.labels),
        "ab": None if run.ab is None else dumps(run.ab), "checked": True,
        "bisect": None if run.bisect is None else dumps(run.bisect),
        "tune": None if run.tune is None else dumps(run.tune),
        "numerics": None if run.numerics is None else dumps(run.numerics),
    }


def outcome_row(run_id: str, position: int, outcome: TestOutcome) -> dict[str, Any]:
    return {"run_id": run_id, "position": position, "test_id": outcome.test_id,
            "outcome": outcome.outcome.value, "duration_s": outcome.duration_s,
            "message": outcome.message}


def figure_row(run: RunRecord, position: int, figure: Figure) -> dict[str, Any]:
    return {"run_id": run.run_id, "position": position, "test_id": figure.test_id,
            "metric": figure.metric, "value": figure.value, "predicted": figure.predicted,
            "hardware_identity": run.hardware.identity, "build_key": run.build.build_key,
            **asdict(figure.key)}


def report_row(run_id: str, state: ReportState) -> dict[str, Any]:
    # PostgreSQL's text cannot hold NUL and SQLite's can: the report's words (often a
    # tool's output) are kept readable on both rather than failing on one.
    message = None if state.message is None else _no_nul(state.message)
    return {"run_id": run_id, "state": state.state, "message": message,
            "problems": dumps(list(state.problems)), "queued_ns": state.queued_ns,
            "updated_at": _no_nul(state.updated_at),
            # A state set from outside a claim (queued again, or recorded) ends any claim.
            "claimed_by": None, "lease_ns": None}


def _no_nul(text: str) -> str:
    return text.replace("\x00", "\ufffd")


# -- rows -> records -----------------------------------------------------------

def report_state(row: RowMapping) -> ReportState:
    return ReportState(state=row["state"], message=row["message"],
                       problems=tuple(str(p) for p in json.loads(row["problems"])),
                       queued_ns=int(row["queued_ns"]), updated_at=row["updated_at"])


def run_summary(row: RowMapping, outcome_counts: Mapping[str, int]) -> RunSummary:
    """A ``runs`` row whose run reads as a run record, as a summary.

    Raises ValueError for a JSON column that does not parse.
    """
    return RunSummary(
        run_id=row["run_id"], branch=row["branch"], commit=row["commit"],
        started_at=row["started_at"], finished_at=row["finished_at"],
        hardware=Hardware(**json.loads(row["hardware"])),
        build=BuildRef(**json.loads(row["build"])), outcome_counts=dict(outcome_counts))


def outcome_json(row: RowMapping) -> dict[str, Any]:
    """An ``outcomes`` row as the run.json outcome it was."""
    return {"test_id": row["test_id"], "outcome": row["outcome"],
            "duration_s": row["duration_s"], "message": row["message"]}


def run_from_rows(row: RowMapping, outcome_rows: Sequence[Sequence[Any]],
                  figure_rows: Sequence[Sequence[Any]],
                  keys: dict[tuple[Any, ...], FigureKey]) -> RunRecord:
    """The record of a run stored checked, from its rows, without the schema: outcomes
    selected as :data:`OUTCOME_COLUMNS`, figures as :data:`FIGURE_COLUMNS`.

    Raises ValueError for a JSON column that does not parse.
    """
    record = run_from_checked_json(run_json(row, (), ()))
    return replace(record, outcomes=tuple(outcome_from_row(o) for o in outcome_rows),
                   figures=tuple(figure_from_row(f, keys) for f in figure_rows))


#: The ``outcomes`` columns :func:`outcome_from_row` reads, in its order.
OUTCOME_COLUMNS = ("run_id", "test_id", "outcome", "duration_s", "message")


def outcome_from_row(values: Sequence[Any]) -> TestOutcome:
    """An ``outcomes`` row of a run stored checked, selected as :data:`OUTCOME_COLUMNS`,
    as the outcome it was (as run_validation builds one, test id renaming included)."""
    _, test_id, outcome, duration_s, message = values
    return TestOutcome(test_id=current_test_id(test_id), outcome=Outcome(outcome),
                       duration_s=float(duration_s), message=message)


#: The ``figures`` columns :func:`figure_from_row` reads, in its order.
FIGURE_COLUMNS = ("run_id", "test_id", "metric", "value", "predicted", *KEY_FIELDS)


def figure_from_row(values: Sequence[Any], keys: dict[tuple[Any, ...], FigureKey]) -> Figure:
    """A ``figures`` row of a run stored checked, selected as :data:`FIGURE_COLUMNS`, as
    the figure it was (as run_validation builds one, test id renaming included).

    ``keys`` holds the keys made so far, one object per key: a run has hundreds of
    figures over a few dozen keys, and a history reads those of a thousand runs.
    """
    _, test_id, metric, value, predicted, *key_values = values
    found = tuple(key_values)
    key = keys.get(found)
    if key is None:
        key = keys[found] = FigureKey(*found)
    return Figure(test_id=current_test_id(test_id), key=key, metric=metric,
                  value=float(value), predicted=None if predicted is None else float(predicted))


def figure_json(row: RowMapping) -> dict[str, Any]:
    """A ``figures`` row as the run.json figure it was."""
    figure = {"test_id": row["test_id"], "key": {name: row[name] for name in KEY_FIELDS},
              "metric": row["metric"], "value": row["value"]}
    return figure if row["predicted"] is None else {**figure, "predicted": row["predicted"]}


def run_json(row: RowMapping, outcomes: Sequence[dict[str, Any]],
             figures: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run.json body of a ``runs`` row and its outcomes and figures, unchecked.

    Raises ValueError for a JSON column that does not parse.
    """
    # A run without an A/B result has no ``ab`` key, as its run.json has none.
    ab = {} if row["ab"] is None else {"ab": json.loads(row["ab"])}
    bisect = {} if row["bisect"] is None else {"bisect": json.loads(row["bisect"])}
    tune = {} if row["tune"] is None else {"tune": json.loads(row["tune"])}
    numerics = ({} if row["numerics"] is None
                else {"numerics": json.loads(row["numerics"])})
    return {
        "run_id": row["run_id"], "branch": row["branch"], "commit": row["commit"],
        "started_at": row["started_at"], "finished_at": row["finished_at"],
        "hardware": json.loads(row["hardware"]), "build": json.loads(row["build"]),
        "harness_version": row["harness_version"],
        "outcomes": list(outcomes), "figures": list(figures),
        "labels": json.loads(row["labels"]), **ab, **bisect, **tune, **numerics,
    }
