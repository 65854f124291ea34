"""The results store: run records in SQLite or PostgreSQL, one code path for both.

SQLAlchemy Core with portable column types; JSON-shaped parts of a run (hardware,
build, labels, its A/B result) are kept as JSON text so both backends store them the
same way, and figures get one column per :class:`FigureKey` field so they can be
queried by key.
Every run goes in through :func:`check_run` and comes out through :func:`run_from_json`,
so both backends keep exactly the runs the ``run.json`` schema accepts.

Each run may have a report state (:class:`ReportState`), kept here rather than in a
file so the results service stores a run and its pending report in one transaction.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from types import TracebackType
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    ColumnElement,
    Connection,
    Engine,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    and_,
    create_engine,
    delete,
    event,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError

from harness.errors import HarnessError
from harness.paths import cache_root
from harness.results.model import Figure, FigureKey, RunRecord, TestOutcome
from harness.results.run_schema import RunRecordError, check_run, run_from_json

__all__ = [
    "REPORT_STATES",
    "STORE_SCHEMA_VERSION",
    "ReportState",
    "ResultsStore",
    "ResultsStoreError",
    "RunRecordError",
    "default_url",
    "display_url",
    "open_store",
]

log = logging.getLogger(__name__)

#: Bumped whenever a table changes shape, with a step in _MIGRATIONS that brings a store
#: of the version before up to it and a test that opens such a store
#: (tests/test_results_store.py). A store written by a newer harness is refused.
#: 1: runs, outcomes, figures. 2: reports. 3: runs.ab.
STORE_SCHEMA_VERSION = 3

#: How long a SQLite writer waits for another writer's lock before giving up (seconds).
SQLITE_BUSY_TIMEOUT_S = 60.0

#: How long opening a PostgreSQL connection may take before the store counts as down.
POSTGRES_CONNECT_TIMEOUT_S = 10

#: Arbitrary constant naming the advisory lock that serialises schema creation.
_PG_SCHEMA_LOCK = 0x6C6C616D  # "llam"

#: Execution option asking the SQLite begin hook for a write (IMMEDIATE) transaction.
_WRITE = "harness_write"

_INT_KEY_FIELDS = frozenset(f.name for f in fields(FigureKey) if f.type in ("int", int))
_KEY_FIELDS = tuple(f.name for f in fields(FigureKey))


class ResultsStoreError(HarnessError):
    """The results store could not be opened, read or written."""


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


# Strings carry no length: PostgreSQL would enforce one and SQLite would not, and the
# two backends must accept exactly the same runs.
metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
)

# seq is the surrogate key because SQLite only autoincrements an INTEGER PRIMARY KEY;
# run_id is unique, which is what makes add_run idempotent under concurrency.
runs = Table(
    "runs", metadata,
    Column("seq", Integer, primary_key=True, autoincrement=True),
    Column("run_id", String(), nullable=False, unique=True),
    Column("branch", String(), nullable=False),
    Column("commit", String(), nullable=False),
    Column("started_at", String(), nullable=False),
    Column("finished_at", String(), nullable=False),
    Column("hardware_identity", String(), nullable=False),
    Column("hardware", Text, nullable=False),
    Column("build", Text, nullable=False),
    Column("harness_version", String(), nullable=False),
    Column("labels", Text, nullable=False),
    # The run's A/B result as JSON text, NULL for a run without one. Text, not a column
    # per value: nothing queries inside it, and it reads back through the schema whole.
    Column("ab", Text, nullable=True),
    Index("ix_runs_order", "started_at", "seq"),
    Index("ix_runs_branch", "branch"),
    Index("ix_runs_hardware", "hardware_identity"),
)

# position keeps the record's order so a stored run reads back equal to what was added.
outcomes = Table(
    "outcomes", metadata,
    Column("run_id", String(), ForeignKey("runs.run_id", ondelete="CASCADE"),
           primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("test_id", Text, nullable=False),
    Column("outcome", String(), nullable=False),
    Column("duration_s", Float, nullable=False),
    Column("message", Text, nullable=True),
)

figures = Table(
    "figures", metadata,
    Column("run_id", String(), ForeignKey("runs.run_id", ondelete="CASCADE"),
           primary_key=True),
    Column("position", Integer, primary_key=True, autoincrement=False),
    Column("test_id", Text, nullable=False),
    Column("metric", String(), nullable=False),
    Column("value", Float, nullable=False),
    Column("hardware_identity", String(), nullable=False),
    Column("build_key", String(), nullable=False),
    *(Column(name, Integer if name in _INT_KEY_FIELDS else String(), nullable=False)
      for name in _KEY_FIELDS),
    Index("ix_figures_metric", "metric", "hardware_identity"),
)

# queued_ns is a BigInteger: time.time_ns() overflows PostgreSQL's 32-bit INTEGER.
reports = Table(
    "reports", metadata,
    Column("run_id", String(), ForeignKey("runs.run_id", ondelete="CASCADE"),
           primary_key=True),
    Column("state", String(), nullable=False),
    Column("message", Text, nullable=True),
    # A JSON list of strings.
    Column("problems", Text, nullable=False),
    Column("queued_ns", BigInteger, nullable=False),
    Column("updated_at", String(), nullable=False),
    Index("ix_reports_state", "state", "queued_ns"),
)


def default_url() -> str:
    """``$HARNESS_RESULTS_URL``, or a SQLite file in the harness cache."""
    configured = os.environ.get("HARNESS_RESULTS_URL")
    if configured:
        return configured
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{root / 'results.sqlite'}"


def display_url(url: str) -> str:
    """The URL with any password replaced by ``***``, for messages and logs."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        # Not parseable as a URL, so no password can be located; say nothing of it.
        return "<unparseable results URL>"


def _engine_url(url: str) -> URL:
    """Parse ``url`` and pin PostgreSQL to the psycopg (3) driver, the one installed."""
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ResultsStoreError(
            f"results URL {display_url(url)!r} is not a database URL; use "
            "sqlite:///PATH or postgresql://USER:PASSWORD@HOST:PORT/DB "
            "(HARNESS_RESULTS_URL or --results-url)") from exc
    backend, _, driver = parsed.drivername.partition("+")
    if backend in ("postgresql", "postgres") and driver in ("", "psycopg"):
        return parsed.set(drivername="postgresql+psycopg")
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if not parsed.database or parsed.database == ":memory:":
            raise ResultsStoreError(
                f"results URL {display_url(url)!r} names no file; an in-memory store "
                "would forget every run; use sqlite:///PATH")
        return parsed
    raise ResultsStoreError(
        f"results URL {display_url(url)!r} uses {parsed.drivername!r}; the store "
        "supports sqlite:///PATH and postgresql://USER:PASSWORD@HOST:PORT/DB")


def _sqlite_engine(url: URL) -> Engine:
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy emit BEGIN itself (below): sqlite3's own deferred BEGIN makes
        # a reader that later writes fail at once with "database is locked" instead of
        # waiting on the busy timeout.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout = {int(SQLITE_BUSY_TIMEOUT_S * 1000)}")
        # WAL: readers never block the writer nor it them; one writer at a time waits.
        _use_wal(cursor)
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front, waiting on the busy timeout for it.
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


def _use_wal(cursor: Any) -> None:
    """``PRAGMA journal_mode = WAL``, waiting out other connections that hold the file.

    Switching needs the database to itself and, unlike other statements, fails at once
    with "database is locked" instead of waiting on the busy timeout: separate
    processes opening a new store together would otherwise fail now and then.
    """
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _postgres_engine(url: URL) -> Engine:
    return create_engine(url, pool_pre_ping=True,
                         connect_args={"connect_timeout": POSTGRES_CONNECT_TIMEOUT_S})


def _reason(exc: BaseException, password: str | None) -> str:
    """The driver's own first line of the error, never carrying the password."""
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    reason = lines[0] if lines else type(orig).__name__
    return reason.replace(password, "***") if password else reason


def open_store(url: str | None = None) -> ResultsStore:
    """Open (creating tables if missing) the store at ``url`` or :func:`default_url`.

    Connects at once, so a wrong URL or a server that is down fails here with a
    :class:`ResultsStoreError` rather than later in the middle of a run.
    """
    raw = url if url is not None else default_url()
    engine_url = _engine_url(raw)
    # As the user wrote it (no driver added), so it matches their setting.
    shown = display_url(raw)
    if engine_url.get_backend_name() == "sqlite":
        engine = _sqlite_engine(engine_url)
    else:
        engine = _postgres_engine(engine_url)
    try:
        _create_schema(engine, shown)
    except ResultsStoreError:
        engine.dispose()
        raise
    except SQLAlchemyError as exc:
        engine.dispose()
        if engine_url.get_backend_name() == "sqlite":
            fix = ("does its directory exist, and may this user write there? "
                   "Check HARNESS_RESULTS_URL or --results-url")
        else:
            fix = ("is the server running and reachable, and are the user, password "
                   "and database right? Check HARNESS_RESULTS_URL or --results-url")
        raise ResultsStoreError(
            f"cannot open the results store at {shown}: "
            f"{_reason(exc, engine_url.password)}; {fix}") from exc
    return ResultsStore(engine, shown)


def _create_schema(engine: Engine, shown: str) -> None:
    """Create or migrate the tables, serialised so concurrent first opens do not collide.

    One transaction: a migration that fails leaves the store at its old version.
    """
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            if engine.dialect.name == "postgresql":
                # CREATE TABLE IF NOT EXISTS still races in PostgreSQL (pg_type names).
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": _PG_SCHEMA_LOCK})
            schema_version.create(conn, checkfirst=True)
            found = conn.execute(select(func.max(schema_version.c.version))).scalar()
            if found is not None and found > STORE_SCHEMA_VERSION:
                raise ResultsStoreError(
                    f"the results store at {shown} has schema {found}, newer than this "
                    f"harness's {STORE_SCHEMA_VERSION}; upgrade the harness or point "
                    "HARNESS_RESULTS_URL at another store")
            if found is not None and found < STORE_SCHEMA_VERSION:
                for step in range(found, STORE_SCHEMA_VERSION):
                    _MIGRATIONS[step](conn)
                    log.info("results store at %s: migrated schema %d to %d",
                             shown, step, step + 1)
            metadata.create_all(conn, checkfirst=True)
            if found != STORE_SCHEMA_VERSION:
                conn.execute(delete(schema_version))
                conn.execute(schema_version.insert().values(version=STORE_SCHEMA_VERSION))


def _add_reports(conn: Connection) -> None:
    """1 -> 2: the reports table, empty (the service decides which runs need one)."""
    reports.create(conn, checkfirst=True)


def _add_ab(conn: Connection) -> None:
    """2 -> 3: runs.ab, NULL for every run already stored (none had an A/B result)."""
    # The one ALTER both backends spell alike; a nullable column needs no default, so
    # neither rewrites the table.
    conn.execute(text("ALTER TABLE runs ADD COLUMN ab TEXT"))


#: Step n brings a store at schema n to n + 1, inside _create_schema's transaction.
_MIGRATIONS = {1: _add_reports, 2: _add_ab}


class ResultsStore:
    """Run records kept in a database; build one with :func:`open_store`."""

    def __init__(self, engine: Engine, url_for_display: str) -> None:
        self._engine = engine
        #: The store's URL with the password hidden.
        self.url_for_display = url_for_display

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
                f"{_reason(exc, password)}; check that the database is up and "
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
                conn.execution_options(**{_WRITE: True})
                with conn.begin():
                    conn.execute(runs.insert().values(_run_row(run)))
                    if run.outcomes:
                        conn.execute(outcomes.insert(), [
                            _outcome_row(run.run_id, i, o)
                            for i, o in enumerate(run.outcomes)])
                    if run.figures:
                        conn.execute(figures.insert(), [
                            _figure_row(run, i, f) for i, f in enumerate(run.figures)])
                    if report is not None:
                        conn.execute(reports.insert().values(_report_row(run.run_id, report)))
        except ResultsStoreError as exc:
            # Another writer got there first: the unique run_id said no, and this
            # transaction left nothing behind. Any other integrity failure is real.
            if isinstance(exc.__cause__, IntegrityError) and self._has_run(run.run_id):
                return False
            raise
        return True

    def set_report_state(self, run_id: str, state: ReportState) -> None:
        """Record ``state`` as the report state of the stored run ``run_id`` (insert or update)."""
        row = _report_row(run_id, state)
        changes = {k: v for k, v in row.items() if k != "run_id"}
        dialect = postgresql if self._engine.dialect.name == "postgresql" else sqlite
        # INSERT .. ON CONFLICT DO UPDATE (both backends spell it so): one statement, so
        # two writers racing on a new row cannot both try the insert.
        upsert = dialect.insert(reports).values(row)
        upsert = upsert.on_conflict_do_update(index_elements=[reports.c.run_id], set_=changes)
        try:
            with self._errors(f"setting the report state of run {run_id}"), \
                    self._engine.connect() as conn:
                conn.execution_options(**{_WRITE: True})
                with conn.begin():
                    conn.execute(upsert)
        except ResultsStoreError as exc:
            # The only constraint an upsert can break is the run's foreign key.
            if isinstance(exc.__cause__, IntegrityError) and not self._has_run(run_id):
                raise ResultsStoreError(
                    f"no run {run_id!r} in the results store at {self.url_for_display}; "
                    "store the run (add_run) before its report state") from exc
            raise

    # -- reading --------------------------------------------------------------

    def report_states(self, run_ids: Sequence[str]) -> dict[str, ReportState]:
        """The report state of each of ``run_ids`` that has one (others are left out)."""
        if not run_ids:
            return {}
        query = select(reports).where(reports.c.run_id.in_(list(dict.fromkeys(run_ids))))
        with self._errors("reading report states"), self._engine.connect() as conn:
            return {row["run_id"]: _report_state(row)
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

    def _has_run(self, run_id: str) -> bool:
        with self._errors(f"looking up run {run_id}"), self._engine.connect() as conn:
            found = conn.execute(select(runs.c.seq).where(runs.c.run_id == run_id)).first()
        return found is not None

    def get_run(self, run_id: str) -> RunRecord | None:
        """The stored run ``run_id``, or None."""
        with self._errors(f"reading run {run_id}"), self._engine.connect() as conn:
            rows = conn.execute(select(runs).where(runs.c.run_id == run_id)).mappings().all()
            loaded = _load(conn, rows)
        return loaded[0] if loaded else None

    def list_runs(self, *, branch: str | None = None, hardware: str | None = None,
                  limit: int | None = None, before_run: str | None = None) -> list[RunRecord]:
        """Stored runs, newest first (``started_at``, then order of storing).

        ``hardware`` matches :attr:`Hardware.identity`; ``before_run`` keeps only runs
        older than that stored run in this same order.
        """
        query = select(runs)
        if branch is not None:
            query = query.where(runs.c.branch == branch)
        if hardware is not None:
            query = query.where(runs.c.hardware_identity == hardware)
        with self._errors("listing runs"), self._engine.connect() as conn:
            if before_run is not None:
                pivot = conn.execute(select(runs.c.started_at, runs.c.seq)
                                     .where(runs.c.run_id == before_run)).first()
                if pivot is None:
                    raise ResultsStoreError(
                        f"no run {before_run!r} in the results store at "
                        f"{self.url_for_display}; `harness compare` lists the stored runs "
                        "when given an unknown one")
                query = query.where(_older_than(*pivot))
            query = query.order_by(runs.c.started_at.desc(), runs.c.seq.desc())
            if limit is None:
                return _load(conn, conn.execute(query).mappings().all())
            # A run _load leaves out (it fails the schema) must not shorten the page, or
            # make latest_run say there is none: read on past it until the page is full.
            found: list[RunRecord] = []
            page = query
            while len(found) < limit:
                wanted = limit - len(found)
                rows = conn.execute(page.limit(wanted)).mappings().all()
                found += _load(conn, rows)
                if len(rows) < wanted:
                    break
                page = query.where(_older_than(rows[-1]["started_at"], rows[-1]["seq"]))
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


# -- rows <-> records ----------------------------------------------------------

def _older_than(started_at: str, seq: int) -> ColumnElement[bool]:
    """Runs after the run (``started_at``, ``seq``) in list_runs' newest-first order."""
    return or_(runs.c.started_at < started_at,
               and_(runs.c.started_at == started_at, runs.c.seq < seq))


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _run_row(run: RunRecord) -> dict[str, Any]:
    return {
        "run_id": run.run_id, "branch": run.branch, "commit": run.commit,
        "started_at": run.started_at, "finished_at": run.finished_at,
        "hardware_identity": run.hardware.identity,
        "hardware": _dumps(asdict(run.hardware)), "build": _dumps(asdict(run.build)),
        "harness_version": run.harness_version, "labels": _dumps(run.labels),
        "ab": None if run.ab is None else _dumps(run.ab),
    }


def _outcome_row(run_id: str, position: int, outcome: TestOutcome) -> dict[str, Any]:
    return {"run_id": run_id, "position": position, "test_id": outcome.test_id,
            "outcome": outcome.outcome, "duration_s": outcome.duration_s,
            "message": outcome.message}


def _figure_row(run: RunRecord, position: int, figure: Figure) -> dict[str, Any]:
    return {"run_id": run.run_id, "position": position, "test_id": figure.test_id,
            "metric": figure.metric, "value": figure.value,
            "hardware_identity": run.hardware.identity, "build_key": run.build.build_key,
            **asdict(figure.key)}


def _report_row(run_id: str, state: ReportState) -> dict[str, Any]:
    # PostgreSQL's text cannot hold NUL and SQLite's can: the report's words (often a
    # tool's output) are kept readable on both rather than failing on one.
    message = None if state.message is None else _no_nul(state.message)
    return {"run_id": run_id, "state": state.state, "message": message,
            "problems": _dumps(list(state.problems)), "queued_ns": state.queued_ns,
            "updated_at": _no_nul(state.updated_at)}


def _no_nul(text: str) -> str:
    return text.replace("\x00", "\ufffd")


def _report_state(row: Any) -> ReportState:
    return ReportState(state=row["state"], message=row["message"],
                       problems=tuple(str(p) for p in json.loads(row["problems"])),
                       queued_ns=int(row["queued_ns"]), updated_at=row["updated_at"])


def _load(conn: Connection, rows: Sequence[Any]) -> list[RunRecord]:
    """Records for ``rows`` of ``runs``, in their order, with outcomes and figures.

    Each is rebuilt through the run.json schema. One that fails it (a NaN stored before
    add_run checked runs) is left out with a warning, so it cannot take listing down.
    """
    if not rows:
        return []
    ids = [row["run_id"] for row in rows]
    found_outcomes: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    for o in conn.execute(select(outcomes).where(outcomes.c.run_id.in_(ids))
                          .order_by(outcomes.c.run_id, outcomes.c.position)).mappings():
        found_outcomes[o["run_id"]].append({
            "test_id": o["test_id"], "outcome": o["outcome"],
            "duration_s": o["duration_s"], "message": o["message"]})
    found_figures: dict[str, list[dict[str, Any]]] = {i: [] for i in ids}
    for f in conn.execute(select(figures).where(figures.c.run_id.in_(ids))
                          .order_by(figures.c.run_id, figures.c.position)).mappings():
        found_figures[f["run_id"]].append({
            "test_id": f["test_id"], "key": {name: f[name] for name in _KEY_FIELDS},
            "metric": f["metric"], "value": f["value"]})
    loaded: list[RunRecord] = []
    for row in rows:
        run_id = row["run_id"]
        try:
            # A run without an A/B result has no ``ab`` key, as its run.json has none.
            ab = {} if row["ab"] is None else {"ab": json.loads(row["ab"])}
            loaded.append(run_from_json({
                "run_id": run_id, "branch": row["branch"], "commit": row["commit"],
                "started_at": row["started_at"], "finished_at": row["finished_at"],
                "hardware": json.loads(row["hardware"]), "build": json.loads(row["build"]),
                "harness_version": row["harness_version"],
                "outcomes": found_outcomes[run_id], "figures": found_figures[run_id],
                "labels": json.loads(row["labels"]), **ab,
            }, source=f"stored run {run_id!r}"))
        except ValueError as exc:  # RunRecordError, or JSON text that does not parse
            log.warning("results store: skipping run %r, which no longer reads as a run "
                        "record: %s", run_id, exc)
    return loaded
