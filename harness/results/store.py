"""The results store: run records in SQLite or PostgreSQL, one code path for both.

SQLAlchemy Core with portable column types; JSON-shaped parts of a run (hardware,
build, labels) are kept as JSON text so both backends store them the same way, and
figures get one column per :class:`FigureKey` field so they can be queried by key.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, fields
from types import TracebackType
from typing import Any

from sqlalchemy import (
    Column,
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
    event,
    func,
    or_,
    select,
    text,
)
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, SQLAlchemyError

from harness.errors import HarnessError
from harness.paths import cache_root
from harness.results.model import (
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    RunRecord,
    TestOutcome,
)

#: Bumped when the tables change shape; a store written by a newer harness is refused.
STORE_SCHEMA_VERSION = 1

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
        cursor.execute("PRAGMA journal_mode = WAL")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # IMMEDIATE takes the write lock up front, waiting on the busy timeout for it.
        write = conn.get_execution_options().get(_WRITE, False)
        conn.exec_driver_sql("BEGIN IMMEDIATE" if write else "BEGIN")

    return engine


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
    """Create missing tables, serialised so concurrent first opens do not collide."""
    with engine.connect() as conn:
        conn.execution_options(**{_WRITE: True})
        with conn.begin():
            if engine.dialect.name == "postgresql":
                # CREATE TABLE IF NOT EXISTS still races in PostgreSQL (pg_type names).
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": _PG_SCHEMA_LOCK})
            metadata.create_all(conn, checkfirst=True)
            found = conn.execute(select(func.max(schema_version.c.version))).scalar()
            if found is None:
                conn.execute(schema_version.insert().values(version=STORE_SCHEMA_VERSION))
            elif found > STORE_SCHEMA_VERSION:
                raise ResultsStoreError(
                    f"the results store at {shown} has schema {found}, newer than this "
                    f"harness's {STORE_SCHEMA_VERSION}; upgrade the harness or point "
                    "HARNESS_RESULTS_URL at another store")


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

    def add_run(self, run: RunRecord) -> bool:
        """Store ``run``; True when stored now, False when its run_id was already there.

        Everything for one run goes in one transaction, so a run is there whole or
        not at all, and concurrent adds of the same run store it exactly once.
        """
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
        except ResultsStoreError as exc:
            # Another writer got there first: the unique run_id said no, and this
            # transaction left nothing behind. Any other integrity failure is real.
            if isinstance(exc.__cause__, IntegrityError) and self._has_run(run.run_id):
                return False
            raise
        return True

    # -- reading --------------------------------------------------------------

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
                started, seq = pivot
                query = query.where(or_(runs.c.started_at < started,
                                        and_(runs.c.started_at == started,
                                             runs.c.seq < seq)))
            query = query.order_by(runs.c.started_at.desc(), runs.c.seq.desc())
            if limit is not None:
                query = query.limit(limit)
            rows = conn.execute(query).mappings().all()
            return _load(conn, rows)

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

def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def _run_row(run: RunRecord) -> dict[str, Any]:
    return {
        "run_id": run.run_id, "branch": run.branch, "commit": run.commit,
        "started_at": run.started_at, "finished_at": run.finished_at,
        "hardware_identity": run.hardware.identity,
        "hardware": _dumps(asdict(run.hardware)), "build": _dumps(asdict(run.build)),
        "harness_version": run.harness_version, "labels": _dumps(run.labels),
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


def _load(conn: Connection, rows: Sequence[Any]) -> list[RunRecord]:
    """Records for ``rows`` of ``runs``, in their order, with outcomes and figures."""
    if not rows:
        return []
    ids = [row["run_id"] for row in rows]
    found_outcomes: dict[str, list[TestOutcome]] = {i: [] for i in ids}
    for o in conn.execute(select(outcomes).where(outcomes.c.run_id.in_(ids))
                          .order_by(outcomes.c.run_id, outcomes.c.position)).mappings():
        found_outcomes[o["run_id"]].append(TestOutcome(
            test_id=o["test_id"], outcome=o["outcome"], duration_s=float(o["duration_s"]),
            message=o["message"]))
    found_figures: dict[str, list[Figure]] = {i: [] for i in ids}
    for f in conn.execute(select(figures).where(figures.c.run_id.in_(ids))
                          .order_by(figures.c.run_id, figures.c.position)).mappings():
        key = FigureKey(**{name: f[name] for name in _KEY_FIELDS})
        found_figures[f["run_id"]].append(Figure(
            test_id=f["test_id"], key=key, metric=f["metric"], value=float(f["value"])))
    return [RunRecord(
        run_id=row["run_id"], branch=row["branch"], commit=row["commit"],
        started_at=row["started_at"], finished_at=row["finished_at"],
        hardware=Hardware(**json.loads(row["hardware"])),
        build=BuildRef(**json.loads(row["build"])),
        harness_version=row["harness_version"],
        outcomes=tuple(found_outcomes[row["run_id"]]),
        figures=tuple(found_figures[row["run_id"]]),
        labels=dict(json.loads(row["labels"])),
    ) for row in rows]
