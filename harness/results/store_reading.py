"""What the store's selected rows become: run records, summaries and figures (no
transactions of its own: the store hands it a connection and the ``runs`` rows).

A run add_run stored is marked checked (``runs.checked``) and is rebuilt from its rows
as it is: checking every stored run against the run.json schema again on every read is
what made listings slow at thousands of runs. A run stored before that mark (store
schema 4 or older, when schema 1 took NaN) is checked through :func:`run_from_json` the
first time this reader meets it and remembered if it passes, since a stored run never
changes; one that fails is left out with a warning, so it cannot take a listing down.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, Row, RowMapping, func, select

from harness.results.run_record import Figure, FigureKey, RunRecord
from harness.results.run_summary import RunSummary
from harness.results.run_validation import run_from_json
from harness.results.store_rows import (
    FIGURE_COLUMNS,
    OUTCOME_COLUMNS,
    figure_from_row,
    figure_json,
    outcome_json,
    run_from_rows,
    run_json,
    run_summary,
)
from harness.results.store_tables import KEY_FIELDS, figures, outcomes, runs

# The store's own logger: a skipped run is the store's warning to whoever watches it.
log = logging.getLogger("harness.results.store")


class RowReader:
    """Reads rows of one store; remembers which unchecked runs passed the schema."""

    def __init__(self) -> None:
        #: Ids of runs stored unchecked that passed the run.json schema when read here.
        self._passed: set[str] = set()

    def readable(self, conn: Connection, rows: Sequence[RowMapping]) -> list[str]:
        """Ids of the runs of ``rows`` (with ``run_id`` and ``checked``) that read as run
        records: checked when stored, or checked here now or before (and remembered)."""
        unchecked = [row["run_id"] for row in rows
                     if not row["checked"] and row["run_id"] not in self._passed]
        if unchecked:
            self.records(conn, conn.execute(select(runs).where(runs.c.run_id.in_(unchecked)))
                         .mappings().all())
        return [row["run_id"] for row in rows
                if row["checked"] or row["run_id"] in self._passed]

    def summaries(self, conn: Connection, rows: Sequence[RowMapping]) -> list[RunSummary]:
        """Summaries of the runs of ``rows`` that read as run records, in their order."""
        readable = set(self.readable(conn, rows))
        counts: dict[str, dict[str, int]] = {run_id: {} for run_id in readable}
        if readable:
            count = (select(outcomes.c.run_id, outcomes.c.outcome, func.count())
                     .where(outcomes.c.run_id.in_(list(readable)))
                     .group_by(outcomes.c.run_id, outcomes.c.outcome))
            for run_id, word, n in conn.execute(count):
                counts[run_id][word] = int(n)
        found: list[RunSummary] = []
        for row in rows:
            if row["run_id"] in readable:
                try:
                    found.append(run_summary(row, counts[row["run_id"]]))
                except ValueError as exc:  # JSON text that does not parse
                    _skipped(row["run_id"], exc)
        return found

    def records(self, conn: Connection, rows: Sequence[RowMapping]) -> list[RunRecord]:
        """Records for ``rows`` of ``runs``, in their order, with outcomes and figures.

        A run stored checked is rebuilt as it is; one from before store schema 5 is
        rebuilt through the run.json schema the first time it is read here, and one that
        fails it (a NaN stored before add_run checked runs) is left out with a warning,
        so it cannot take listing down.
        """
        if not rows:
            return []
        ids = [row["run_id"] for row in rows]
        found_outcomes: dict[str, list[Row[Any]]] = {i: [] for i in ids}
        for o in conn.execute(select(*(outcomes.c[name] for name in OUTCOME_COLUMNS))
                              .where(outcomes.c.run_id.in_(ids))
                              .order_by(outcomes.c.run_id, outcomes.c.position)):
            found_outcomes[o[0]].append(o)
        found_figures: dict[str, list[Row[Any]]] = {i: [] for i in ids}
        for f in conn.execute(select(*(figures.c[name] for name in FIGURE_COLUMNS))
                              .where(figures.c.run_id.in_(ids))
                              .order_by(figures.c.run_id, figures.c.position)):
            found_figures[f[0]].append(f)
        loaded: list[RunRecord] = []
        keys: dict[tuple[Any, ...], FigureKey] = {}
        for row in rows:
            run_id = row["run_id"]
            try:
                if row["checked"] or run_id in self._passed:
                    loaded.append(run_from_rows(row, found_outcomes[run_id],
                                                found_figures[run_id], keys))
                    continue
                body = run_json(row, [outcome_json(o._mapping) for o in found_outcomes[run_id]],
                                [figure_json(f._mapping) for f in found_figures[run_id]])
                loaded.append(run_from_json(body, source=f"stored run {run_id!r}"))
                self._passed.add(run_id)
            except ValueError as exc:  # RunRecordError, or JSON text that does not parse
                _skipped(run_id, exc)
        return loaded

    def figures(self, conn: Connection, run_ids: Sequence[str], rows: Sequence[RowMapping],
                *, metric: str | None, key: str | None) -> dict[str, tuple[Figure, ...]]:
        """The figures of each of ``run_ids`` whose ``runs`` row (``run_id``, ``checked``)
        is in ``rows`` and reads as a run record, in the run's order: only ``metric``'s
        when given, and only those of the figure key whose label is ``key``."""
        readable = self.readable(conn, rows)
        query = (select(*(figures.c[name] for name in FIGURE_COLUMNS))
                 .where(figures.c.run_id.in_(readable)))
        if metric is not None:
            query = query.where(figures.c.metric == metric)
        grouped: dict[str, list[Figure]] = {run_id: [] for run_id in readable}
        # One key object, and one answer whether it is the asked one, per key: a history
        # reads a thousand runs' figures over the same few dozen keys.
        keys: dict[tuple[Any, ...], FigureKey] = {}
        wanted: dict[tuple[Any, ...], bool] = {}
        first_key = len(FIGURE_COLUMNS) - len(KEY_FIELDS)
        for row in conn.execute(query.order_by(figures.c.run_id, figures.c.position)):
            if key is not None:
                values = tuple(row[first_key:])
                if values not in wanted:
                    wanted[values] = FigureKey(*values).label() == key
                if not wanted[values]:
                    continue
            grouped[row[0]].append(figure_from_row(row, keys))
        return {run_id: tuple(grouped[run_id]) for run_id in run_ids if run_id in grouped}


def _skipped(run_id: str, exc: ValueError) -> None:
    log.warning("results store: skipping run %r, which no longer reads as a run "
                "record: %s", run_id, exc)
