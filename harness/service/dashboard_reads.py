"""The two reads the dashboard needs that loading whole runs cannot answer cheaply.

- :meth:`DashboardReads.window`: the ids of the runs a branch page shows, in the order
  ``ResultsStore.list_runs`` gives them, from the ``runs`` table alone. It is how the
  service knows whether what it drew is still current: a few milliseconds, where
  loading the 60 runs of a main-job page through the run schema takes over a second.
- :meth:`DashboardReads.index`: every branch and hardware pair with its number of runs
  and newest start, one ``GROUP BY`` over ``runs`` (then the hardware of the page's rows),
  so the index costs the same at 10,000 runs as at 10.

Both are the store's queries (:mod:`harness.results.store_listing`) on the store's own
engine; a database failure is a :class:`ResultsStoreError`, which the service answers
with 503.
"""

from __future__ import annotations

import json

from harness.results.run_record import Hardware
from harness.results.store import ResultsStore
from harness.service.dashboard import IndexRow
from harness.service.dashboard_view import Paged, page_of


class DashboardReads:
    """The dashboard's queries on ``store``."""

    def __init__(self, store: ResultsStore) -> None:
        self._store = store

    def window(self, branch: str, hardware: str, limit: int) -> tuple[str, ...]:
        """Ids of the newest ``limit`` runs of ``branch`` on ``hardware``, newest first."""
        return self._store.newest_run_ids(branch, hardware, limit)

    def index(self, branch: str | None, hardware: str | None, page: int,
              size: int) -> Paged[IndexRow]:
        """Page ``page`` of the branch and hardware pairs with runs, newest run first."""
        pairs = self._store.run_pairs(branch, hardware)
        pairs.sort(key=lambda p: (p.latest, p.newest_seq), reverse=True)
        shown = page_of(pairs, page, size)
        stored = self._store.hardware_columns([p.newest_seq for p in shown.items])
        rows = tuple(IndexRow(p.branch, p.hardware,
                              _describe(stored.get(p.newest_seq, "")) or p.hardware,
                              p.runs, p.latest) for p in shown.items)
        return Paged(items=rows, total=shown.total, page=shown.page, pages=shown.pages,
                     size=shown.size)


def _describe(hardware_json: str) -> str:
    """``Hardware.describe()`` of a stored run's hardware column; empty if it does not read."""
    try:
        return Hardware(**json.loads(hardware_json)).describe()
    except (ValueError, TypeError):
        return ""
