"""The results store: run records in SQLite or PostgreSQL, one code path for both.

:func:`open_store` opens a store, creating or migrating its tables;
:class:`ResultsStore` adds runs and their report states and answers the queries
``harness compare`` and the results service ask. The tables are
:mod:`harness.results.store_tables`, what differs between the backends is
:mod:`harness.results.store_backends`, and how a record becomes rows and back is
:mod:`harness.results.store_rows`.
Every run goes in through :func:`check_run`, so both backends keep exactly the runs the
``run.json`` schema accepts, and is marked checked (``runs.checked``); what the selected
rows become on the way out (records, summaries, figures, and the runs from before that
mark checked once) is :mod:`harness.results.store_reading`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import TypeVar

from sqlalchemy import (
    Connection,
    Engine,
    RowMapping,
    Update,
    func,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from harness.results import report_claims, store_listing
from harness.results.run_record import Figure, RunRecord
from harness.results.run_summary import RunSummary
from harness.results.run_validation import check_run
from harness.results.store_backends import (
    WRITE,
    ResultsStoreError,
    create_store_engine,
    default_url,
    display_url,
    driver_reason,
    engine_url,
)
from harness.results.store_reading import RowReader
from harness.results.store_rows import (
    ReportState,
    dumps,
    figure_row,
    outcome_row,
    report_row,
    report_state,
    run_row,
)
from harness.results.store_tables import create_schema, figures, outcomes, reports, runs

log = logging.getLogger(__name__)

T = TypeVar("T")


def open_store(url: str | None = None) -> ResultsStore:
    """Open (creating tables if missing) the store at ``url`` or :func:`default_url`.

    Connects at once, so a wrong URL or a server that is down fails here with a
    :class:`ResultsStoreError` rather than later in the middle of a run.
    """
    raw = url if url is not None else default_url()
    parsed = engine_url(raw)
    # As the user wrote it (no driver added), so it matches their setting.
    shown = display_url(raw)
    engine = create_store_engine(parsed)
    try:
        create_schema(engine, shown)
    except ResultsStoreError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        if parsed.get_backend_name() == "sqlite":
            fix = ("does its directory exist, and may this user write there? "
                   "Check HARNESS_RESULTS_URL or --results-url")
        else:
            fix = ("is the server running and reachable, and are the user, password "
                   "and database right? Check HARNESS_RESULTS_URL or --results-url")
        raise ResultsStoreError(
            f"cannot open the results store at {shown}: "
            f"{driver_reason(exc, parsed.password)}; {fix}") from exc
    return ResultsStore(engine, shown)


class ResultsStore:
    """Run records kept in a database; build one with :func:`open_store`."""

    def __init__(self, engine: Engine, url_for_display: str) -> None:
        self._engine = engine
        #: The store's URL with the password hidden.
        self.url_for_display = url_for_display
        # Per store object: what it remembers of the runs it has checked.
        self._reader = RowReader()

    # -- lifecycle ------------------------------------------------------------

    def close(self) -> None:
        self._engine.dispose()

    def __enter__(self) -> ResultsStore:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    @contextmanager
    def _errors(self, doing: str) -> Iterator[None]:
        try:
            yield
        except SQLAlchemyError as exc:
            password = self._engine.url.password
            raise ResultsStoreError(
                f"results store at {self.url_for_display} failed while {doing}: "
                f"{driver_reason(exc, password)}; check that the database is up and "
                "HARNESS_RESULTS_URL points at it") from exc

    # -- writing --------------------------------------------------------------

    def add_run(self, run: RunRecord, *, report: ReportState | None = None) -> bool:
        """Store ``run``; True when stored now, False when its run_id was already there.

        Everything for one run goes in one transaction, with ``report`` when given (a
        run is stored with its pending report state or not at all), so a run is there
        whole or not at all, and concurrent adds of the same run store it exactly once.
        A run already there keeps its own report state.

        Raises :class:`RunRecordError` (before touching the database) for a run the
        ``run.json`` schema refuses, so both backends keep the same runs.
        """
        check_run(run)
        try:
            with self._errors(f"adding run {run.run_id}"), self._engine.connect() as conn:
                conn.execution_options(**{WRITE: True})
                with conn.begin():
                    conn.execute(runs.insert().values(run_row(run)))
                    if run.outcomes:
                        conn.execute(outcomes.insert(), [
                            outcome_row(run.run_id, i, o)
                            for i, o in enumerate(run.outcomes)])
                    if run.figures:
                        conn.execute(figures.insert(), [
                            figure_row(run, i, f) for i, f in enumerate(run.figures)])
                    if report is not None:
                        conn.execute(reports.insert().values(report_row(run.run_id, report)))
        except ResultsStoreError as exc:
            # Another writer got there first: the unique run_id said no, and this
            # transaction left nothing behind. Any other integrity failure is real.
            if isinstance(exc.__cause__, IntegrityError) and self._has_run(run.run_id):
                return False
            raise
        return True

    def set_report_state(self, run_id: str, state: ReportState) -> None:
        """Record ``state`` as the report state of the stored run ``run_id`` (insert or update)."""
        row = report_row(run_id, state)
        changes = {k: v for k, v in row.items() if k != "run_id"}
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        # INSERT .. ON CONFLICT DO UPDATE (both backends spell it so): one statement, so
        # two writers racing on a new row cannot both try the insert.
        upsert = dialect.insert(reports).values(row)
        upsert = upsert.on_conflict_do_update(index_elements=[reports.c.run_id], set_=changes)
        try:
            with self._errors(f"setting the report state of run {run_id}"), \
                    self._engine.connect() as conn:
                conn.execution_options(**{WRITE: True})
                with conn.begin():
                    conn.execute(upsert)
        except ResultsStoreError as exc:
            # The only constraint an upsert can break is the run's foreign key.
            if isinstance(exc.__cause__, IntegrityError) and not self._has_run(run_id):
                raise ResultsStoreError(
                    f"no run {run_id!r} in the results store at {self.url_for_display}; "
                    "store the run (add_run) before its report state") from exc
            raise

    def add_report_state(self, run_id: str, state: ReportState) -> bool:
        """Record ``state`` for ``run_id`` only if it has no report state yet; True when
        recorded (two replicas queueing the same stateless run queue it once)."""
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        insert = dialect.insert(reports).values(report_row(run_id, state))
        # RETURNING, not rowcount: psycopg counts a skipped conflict as a row.
        insert = insert.on_conflict_do_nothing(index_elements=[reports.c.run_id]) \
            .returning(reports.c.run_id)
        with self._errors(f"queueing the report of run {run_id}"), \
                self._engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                return conn.execute(insert).first() is not None

    # -- report jobs, claimed by service replicas (report_claims.py) -------------

    def claim_report(self, replica: str, lease_s: float) -> str | None:
        """Claim the next report job for ``replica`` for ``lease_s`` seconds; its run id,
        or None when no job may be claimed now."""
        now = time.time_ns()
        with self._errors("claiming a report job"), self._engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                found: object = conn.execute(report_claims.claimable(now)).scalar()
                if found is None:
                    return None
                run_id = str(found)
                conn.execute(report_claims.take(run_id, replica, now + _ns(lease_s)))
        return run_id

    def renew_claim(self, run_id: str, replica: str, lease_s: float) -> bool:
        """Extend ``replica``'s claim on ``run_id``; False when it no longer holds it."""
        statement = report_claims.renew(run_id, replica, time.time_ns() + _ns(lease_s))
        return bool(self._write(statement, f"renewing the report claim on run {run_id}"))

    def finish_report(self, run_id: str, replica: str, state: ReportState) -> bool:
        """Record ``state`` for the job ``replica`` claimed; False (nothing written) when
        the claim was lost: the run was queued again, or another replica took it over."""
        statement = report_claims.finish(run_id, replica, report_row(run_id, state))
        return bool(self._write(statement, f"recording the report of run {run_id}"))

    def release_claims(self, replica: str) -> int:
        """Give up every claim ``replica`` holds; how many there were."""
        return self._write(report_claims.release_all(replica),
                           f"releasing the report claims of {replica}")

    def set_bisect(self, run: RunRecord) -> bool:
        """Keep ``run.bisect`` as the bisect of the stored run ``run.run_id`` (checked by
        the run.json schema first); False when the store has no such run."""
        check_run(run)
        statement = runs.update().where(runs.c.run_id == run.run_id).values(
            bisect=None if run.bisect is None else dumps(run.bisect))
        return bool(self._write(statement, f"recording the bisect of run {run.run_id}"))

    def _write(self, statement: Update, doing: str) -> int:
        """Run one write in its own transaction; the rows it changed."""
        with self._errors(doing), self._engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with conn.begin():
                return int(conn.execute(statement).rowcount)

    # -- reading --------------------------------------------------------------

    def report_states(self, run_ids: Sequence[str]) -> dict[str, ReportState]:
        """The report state of each of ``run_ids`` that has one (others are left out)."""
        if not run_ids:
            return {}
        query = select(reports).where(reports.c.run_id.in_(list(dict.fromkeys(run_ids))))
        with self._errors("reading report states"), self._engine.connect() as conn:
            return {row["run_id"]: report_state(row)
                    for row in conn.execute(query).mappings()}

    def runs_awaiting_report(self) -> list[str]:
        """Ids of runs whose report is pending, oldest queued first (then order of storing)."""
        query = (select(reports.c.run_id)
                 .join(runs, runs.c.run_id == reports.c.run_id)
                 .where(reports.c.state == "pending")
                 .order_by(reports.c.queued_ns, runs.c.seq))
        with self._errors("listing runs awaiting a report"), self._engine.connect() as conn:
            return [str(r) for r in conn.execute(query).scalars()]

    def runs_without_report(self) -> list[str]:
        """Ids of stored runs with no report state at all, in order of storing."""
        query = (select(runs.c.run_id)
                 .outerjoin(reports, reports.c.run_id == runs.c.run_id)
                 .where(reports.c.run_id.is_(None))
                 .order_by(runs.c.seq))
        with self._errors("listing runs without a report"), self._engine.connect() as conn:
            return [str(r) for r in conn.execute(query).scalars()]

    def newest_run_ids(self, branch: str, hardware: str, limit: int) -> tuple[str, ...]:
        """Ids of the newest ``limit`` runs of ``branch`` on ``hardware``, newest first, as
        list_runs orders them, read from the ``runs`` table alone. A run from before
        schema 5 that fails its check is among them (list_runs leaves it out)."""
        with self._errors("listing a branch's newest runs"), self._engine.connect() as conn:
            return tuple(str(r) for r in conn.execute(
                store_listing.newest_run_ids(branch, hardware, limit)).scalars())

    def run_pairs(self, branch: str | None = None,
                  hardware: str | None = None) -> list[store_listing.RunPair]:
        """Every branch and hardware pair with runs, one ``GROUP BY`` over ``runs``."""
        with self._errors("listing branches and hardware"), self._engine.connect() as conn:
            return [store_listing.RunPair(str(r.branch), str(r.hardware_identity),
                                          int(r.runs), str(r.latest), int(r.newest_seq))
                    for r in conn.execute(store_listing.pair_counts(branch, hardware))]

    def hardware_columns(self, seqs: Sequence[int]) -> dict[int, str]:
        """The stored ``hardware`` JSON of the runs stored as ``seqs``."""
        if not seqs:
            return {}
        with self._errors("reading runs' hardware"), self._engine.connect() as conn:
            return {int(r.seq): str(r.hardware)
                    for r in conn.execute(store_listing.hardware_columns(seqs))}

    def _has_run(self, run_id: str) -> bool:
        with self._errors(f"looking up run {run_id}"), self._engine.connect() as conn:
            found = conn.execute(select(runs.c.seq).where(runs.c.run_id == run_id)).first()
        return found is not None

    def get_run(self, run_id: str) -> RunRecord | None:
        """The stored run ``run_id``, or None."""
        with self._errors(f"reading run {run_id}"), self._engine.connect() as conn:
            rows = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().all()
            loaded = self._reader.records(conn, rows)
        return loaded[0] if loaded else None

    def list_runs(self, *, branch: str | None = None, hardware: str | None = None,
                  limit: int | None = None, before_run: str | None = None) -> list[RunRecord]:
        """Stored runs, newest first (``started_at``, then order of storing).

        ``hardware`` matches :attr:`Hardware.identity`; ``before_run`` keeps only runs
        older than that stored run in this same order.
        """
        with self._errors("listing runs"), self._engine.connect() as conn:
            return self._page(conn, self._reader.records, branch=branch, hardware=hardware,
                              limit=limit, before_run=before_run)

    def list_summaries(self, *, branch: str | None = None, hardware: str | None = None,
                       limit: int | None = None,
                       before_run: str | None = None) -> list[RunSummary]:
        """The runs :meth:`list_runs` lists, as summaries: their outcomes counted by the
        database and their figures not read at all."""
        with self._errors("listing runs"), self._engine.connect() as conn:
            return self._page(conn, self._reader.summaries, branch=branch, hardware=hardware,
                              limit=limit, before_run=before_run)

    def figures_of(self, run_ids: Sequence[str], metric: str | None = None,
                   key: str | None = None) -> dict[str, tuple[Figure, ...]]:
        """The figures of each of ``run_ids`` in the run's order: only ``metric``'s when
        given, and only those of the figure key whose label is ``key``. A run that is not
        stored, or does not read as a run record, is left out."""
        ids = list(dict.fromkeys(run_ids))
        if not ids:
            return {}
        with self._errors("reading figures"), self._engine.connect() as conn:
            found = conn.execute(select(runs.c.run_id, runs.c.checked)
                                 .where(runs.c.run_id.in_(ids))).mappings().all()
            return self._reader.figures(conn, ids, found, metric=metric, key=key)

    def _page(self, conn: Connection, load: Callable[[Connection, Sequence[RowMapping]], list[T]],
              *, branch: str | None, hardware: str | None, limit: int | None,
              before_run: str | None) -> list[T]:
        """What ``load`` makes of the runs matching the filters, newest first, up to
        ``limit`` of them (list_runs' order and filters)."""
        query = store_listing.filtered_runs(branch, hardware)
        if before_run is not None:
            pivot = conn.execute(select(runs.c.started_at, runs.c.seq)
                                 .where(runs.c.run_id == before_run)).first()
            if pivot is None:
                raise ResultsStoreError(
                    f"no run {before_run!r} in the results store at "
                    f"{self.url_for_display}; `harness compare` lists the stored runs "
                    "when given an unknown one")
            query = query.where(store_listing.older_than(*pivot))
        query = query.order_by(runs.c.started_at.desc(), runs.c.seq.desc())
        if limit is None:
            return load(conn, conn.execute(query).mappings().all())
        # A run load leaves out (it fails the schema) must not shorten the page, or make
        # latest_run say there is none: read on past it until the page is full.
        found: list[T] = []
        page = query
        while len(found) < limit:
            wanted = limit - len(found)
            rows = conn.execute(page.limit(wanted)).mappings().all()
            found += load(conn, rows)
            if len(rows) < wanted:
                break
            page = query.where(store_listing.older_than(rows[-1]["started_at"], rows[-1]["seq"]))
        return found

    def latest_run(self, *, branch: str | None = None,
                   hardware: str | None = None) -> RunRecord | None:
        """The newest stored run matching the filters, or None."""
        found = self.list_runs(branch=branch, hardware=hardware, limit=1)
        return found[0] if found else None

    def branches(self, limit: int | None = None) -> list[str]:
        """Branch names with stored runs, most recently run first."""
        newest = func.max(runs.c.seq)
        query = select(runs.c.branch).group_by(runs.c.branch).order_by(newest.desc())
        if limit is not None:
            query = query.limit(limit)
        with self._errors("listing branches"), self._engine.connect() as conn:
            return [str(b) for b in conn.execute(query).scalars()]


def _ns(seconds: float) -> int:
    return int(seconds * 1_000_000_000)
