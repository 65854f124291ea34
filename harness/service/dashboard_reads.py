"""The two store queries the dashboard needs that loading whole runs cannot answer cheaply.

- :meth:`DashboardReads.window`: the ids of the runs a branch page shows, in the order
  ``ResultsStore.list_runs`` gives them, read from the ``runs`` table alone. It is how
  the service knows whether what it drew is still current: a few milliseconds, where
  loading the 60 runs of a main-job page through the run schema takes over a second.
- :meth:`DashboardReads.index`: every branch and hardware pair with its number of runs
  and newest start, one ``GROUP BY`` over ``runs`` (then the hardware of the page's rows),
  so the index costs the same at 10,000 runs as at 10.

Both read the tables :mod:`harness.results.store_tables` defines, on an engine of their
own opened from the store's URL (the store's engine is private to ``ResultsStore``);
a database failure is a :class:`ResultsStoreError`, which the service answers with 503.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from harness.results.run_record import Hardware
from harness.results.store_backends import (
    ResultsStoreError,
    create_store_engine,
    default_url,
    display_url,
    driver_reason,
    engine_url,
)
from harness.results.store_tables import runs
from harness.service.dashboard import IndexRow
from harness.service.dashboard_view import Paged, page_of


@dataclass(frozen=True)
class _Pair:
    branch: str
    hardware: str
    runs: int
    latest: str
    #: The most recently stored run of the pair, whose hardware describes it.
    newest_seq: int


class DashboardReads:
    """The dashboard's queries on the store at ``url`` (None: the default store)."""

    def __init__(self, url: str | None) -> None:
        raw = url if url is not None else default_url()
        self._shown = display_url(raw)
        self._engine = create_store_engine(engine_url(raw))

    def close(self) -> None:
        self._engine.dispose()

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            raise ResultsStoreError(
                f"results store at {self._shown} failed while {doing}: "
                f"{driver_reason(exc, self._engine.url.password)}; check that the database "
                "is up and HARNESS_RESULTS_URL points at it") from exc

    def window(self, branch: str, hardware: str, limit: int) -> tuple[str, ...]:
        """Ids of the newest ``limit`` runs of ``branch`` on ``hardware``, newest first."""
        query = (select(runs.c.run_id)
                 .where(runs.c.branch == branch, runs.c.hardware_identity == hardware)
                 .order_by(runs.c.started_at.desc(), runs.c.seq.desc()).limit(limit))
        with self._errors("listing a dashboard's runs"), self._engine.connect() as conn:
            return tuple(str(r) for r in conn.execute(query).scalars())

    def index(self, branch: str | None, hardware: str | None, page: int,
              size: int) -> Paged[IndexRow]:
        """Page ``page`` of the branch and hardware pairs with runs, newest run first."""
        query = (select(runs.c.branch, runs.c.hardware_identity,
                        func.count().label("runs"), func.max(runs.c.started_at).label("latest"),
                        func.max(runs.c.seq).label("newest_seq"))
                 .group_by(runs.c.branch, runs.c.hardware_identity))
        if branch is not None:
            query = query.where(runs.c.branch == branch)
        if hardware is not None:
            query = query.where(runs.c.hardware_identity == hardware)
        with self._errors("listing the dashboards"), self._engine.connect() as conn:
            pairs = [_Pair(str(r.branch), str(r.hardware_identity), int(r.runs),
                           str(r.latest), int(r.newest_seq)) for r in conn.execute(query)]
            pairs.sort(key=lambda p: (p.latest, p.newest_seq), reverse=True)
            shown = page_of(pairs, page, size)
            seqs = [p.newest_seq for p in shown.items]
            described = {int(r.seq): _describe(str(r.hardware)) for r in conn.execute(
                select(runs.c.seq, runs.c.hardware).where(runs.c.seq.in_(seqs)))} \
                if seqs else {}
        rows = tuple(IndexRow(p.branch, p.hardware, described.get(p.newest_seq) or p.hardware,
                              p.runs, p.latest) for p in shown.items)
        return Paged(items=rows, total=shown.total, page=shown.page, pages=shown.pages,
                     size=shown.size)


def _describe(hardware_json: str) -> str:
    """``Hardware.describe()`` of a stored run's hardware column; empty if it does not read."""
    try:
        return Hardware(**json.loads(hardware_json)).describe()
    except (ValueError, TypeError):
        return ""
