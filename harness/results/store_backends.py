"""Where the results store lives: its URL, and an engine set up for SQLite or PostgreSQL.

The store keeps one code path for both backends; what differs between them is here:
which URLs are accepted (and the psycopg driver pinned), SQLite's WAL journal, busy
timeout and write-locking transactions, PostgreSQL's connect timeout. Also the store's
one error class, and the driver's words for a failure with the password taken out.
"""

from __future__ import annotations

import os
import sqlite3
import time
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError

from harness.errors import HarnessError
from harness.paths import cache_root

#: How long a SQLite writer waits for another writer's lock before giving up (seconds).
SQLITE_BUSY_TIMEOUT_S = 60.0

#: How long opening a PostgreSQL connection may take before the store counts as down.
POSTGRES_CONNECT_TIMEOUT_S = 10

#: Execution option asking the SQLite begin hook for a write (IMMEDIATE) transaction:
#: ``conn.execution_options(**{WRITE: True})`` before ``conn.begin()``.
WRITE = "harness_write"


class ResultsStoreError(HarnessError):
    """The results store could not be opened, read or written."""


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


def engine_url(url: str) -> URL:
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


def create_store_engine(url: URL) -> Engine:
    """An engine for ``url`` (from :func:`engine_url`), set up for its backend."""
    if url.get_backend_name() == "sqlite":
        return _sqlite_engine(url)
    return _postgres_engine(url)


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
        write = conn.get_execution_options().get(WRITE, False)
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


def driver_reason(exc: BaseException, password: str | None) -> str:
    """The driver's own first line of the error, never carrying the password."""
    orig = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    lines = [line.strip() for line in str(orig).splitlines() if line.strip()]
    reason = lines[0] if lines else type(orig).__name__
    return reason.replace(password, "***") if password else reason
