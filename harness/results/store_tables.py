"""The results store's tables, and creating or migrating them when a store is opened.

SQLAlchemy Core with portable column types, so SQLite and PostgreSQL hold the same
layout. JSON-shaped parts of a run (hardware, build, labels, its A/B result) are
JSON text so both backends store them alike, and figures get one column per
:class:`FigureKey` field so they can be queried by key.
"""

from __future__ import annotations

import logging
from dataclasses import fields

from sqlalchemy import (
    BigInteger,
    Boolean,
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
    delete,
    func,
    inspect,
    select,
    text,
)

from harness.results.run_record import FigureKey
from harness.results.store_backends import WRITE, ResultsStoreError

log = logging.getLogger(__name__)

#: Bumped whenever a table changes shape, with a step in _MIGRATIONS that brings a store
#: of the version before up to it and a test that opens such a store
#: (tests/test_results_store.py). A store written by a newer harness is refused.
#: 1: runs, outcomes, figures. 2: reports. 3: runs.ab. 4: figures.predicted.
#: 5: runs.checked, listing indexes per branch, hardware and both, and figures by run and
#: metric. 6: reports.claimed_by and reports.lease_ns (report jobs claimed by replicas).
#: 7: runs.bisect. 8: runs.tune. 9: runs.numerics.
STORE_SCHEMA_VERSION = 9

#: Arbitrary constant naming the advisory lock that serialises schema creation.
_PG_SCHEMA_LOCK = 0x6C6C616D  # "llam"

_INT_KEY_FIELDS = frozenset(f.name for f in fields(FigureKey) if f.type in ("int", int))
#: The FigureKey fields, in order: each is a column of ``figures``.
KEY_FIELDS = tuple(f.name for f in fields(FigureKey))


# Strings carry no length: PostgreSQL would enforce one and SQLite would not, and the
# two backends must accept exactly the same runs.
metadata = MetaData()

schema_version = Table(
    "schema_version", metadata,
    Column("version", Integer, primary_key=True, autoincrement=False),
)

#: The orders runs are listed in, newest first (list_runs: ``started_at``, then ``seq``),
#: with or without the branch and hardware filters: each filter and the order come from
#: one index, so a page is read from its start instead of sorting every matching run.
LISTING_INDEXES = (
    Index("ix_runs_order", "started_at", "seq"),
    Index("ix_runs_branch_order", "branch", "started_at", "seq"),
    Index("ix_runs_hardware_order", "hardware_identity", "started_at", "seq"),
    Index("ix_runs_branch_hardware_order", "branch", "hardware_identity", "started_at", "seq"),
)
#: A history of one metric reads that metric's figures of up to a thousand runs: without
#: it, a database reads every figure of each (or, SQLite, every run's figures of that
#: metric by ix_figures_metric, and sorts them).
FIGURES_BY_METRIC = Index("ix_figures_run_metric", "run_id", "metric", "position")
#: What schema 4 indexed runs by, which the listing indexes replace.
_OLD_RUNS_INDEXES = ("ix_runs_branch", "ix_runs_hardware")

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
    # The run's bisect (harness bisect --record), as JSON text; NULL for a run without one.
    Column("bisect", Text, nullable=True),
    # The run's tune of its card (harness tune --record), as JSON text; NULL without one.
    Column("tune", Text, nullable=True),
    # The run's numerics fingerprints (test id -> fingerprint), as JSON text; NULL without.
    Column("numerics", Text, nullable=True),
    # True: add_run checked the run against the run.json schema before writing it, so it
    # reads back without being checked again. NULL: written by a harness before store
    # schema 5, whose rows may predate that check (schema 1 took NaN); those are checked
    # when read.
    Column("checked", Boolean, nullable=True),
    *LISTING_INDEXES,
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
    # The bandwidth model's decode speed beside a measured decode_tps; NULL without one.
    Column("predicted", Float, nullable=True),
    Column("hardware_identity", String(), nullable=False),
    Column("build_key", String(), nullable=False),
    *(Column(name, Integer if name in _INT_KEY_FIELDS else String(), nullable=False)
      for name in KEY_FIELDS),
    Index("ix_figures_metric", "metric", "hardware_identity"),
    FIGURES_BY_METRIC,
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
    # The service replica making the report now, and until when (time.time_ns()) its
    # claim holds unless renewed; both NULL while nobody is (harness/results/
    # report_claims.py).
    Column("claimed_by", String(), nullable=True),
    Column("lease_ns", BigInteger, nullable=True),
    Index("ix_reports_state", "state", "queued_ns"),
)


def create_schema(engine: Engine, shown: str) -> None:
    """Create or migrate the tables, serialised so concurrent first opens do not collide.

    One transaction: a migration that fails leaves the store at its old version.
    ``shown`` is the store's URL without its password, for messages.
    """
    with engine.connect() as conn:
        conn.execution_options(**{WRITE: True})
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


def _add_predicted(conn: Connection) -> None:
    """3 -> 4: figures.predicted, NULL for every figure already stored (none had one)."""
    conn.execute(text("ALTER TABLE figures ADD COLUMN predicted FLOAT"))


def _add_checked_and_listing_indexes(conn: Connection) -> None:
    """4 -> 5: runs.checked, NULL for every run already stored (each is checked when
    read, as before), the listing indexes in place of the single-column ones, and
    figures by run and metric."""
    conn.execute(text("ALTER TABLE runs ADD COLUMN checked BOOLEAN"))
    for name in _OLD_RUNS_INDEXES:
        conn.execute(text(f"DROP INDEX IF EXISTS {name}"))
    for index in (*LISTING_INDEXES, FIGURES_BY_METRIC):
        index.create(conn, checkfirst=True)


def _add_report_claims(conn: Connection) -> None:
    """5 -> 6: reports.claimed_by and reports.lease_ns, NULL for every report already
    recorded (nobody holds a claim on it). A store that came from schema 1 got the
    reports table in this shape at step 1 -> 2, which creates it from today's layout."""
    present = {column["name"] for column in inspect(conn).get_columns("reports")}
    for name, kind in (("claimed_by", "TEXT"), ("lease_ns", "BIGINT")):
        if name not in present:
            conn.execute(text(f"ALTER TABLE reports ADD COLUMN {name} {kind}"))


def _add_bisect(conn: Connection) -> None:
    """6 -> 7: runs.bisect, NULL for every run already stored (none had a bisect)."""
    conn.execute(text("ALTER TABLE runs ADD COLUMN bisect TEXT"))


def _add_tune(conn: Connection) -> None:
    """7 -> 8: runs.tune, NULL for every run already stored (none had a tune)."""
    conn.execute(text("ALTER TABLE runs ADD COLUMN tune TEXT"))


def _add_numerics(conn: Connection) -> None:
    """8 -> 9: runs.numerics, NULL for every run already stored (none had fingerprints)."""
    conn.execute(text("ALTER TABLE runs ADD COLUMN numerics TEXT"))


#: Step n brings a store at schema n to n + 1, inside create_schema's transaction.
_MIGRATIONS = {1: _add_reports, 2: _add_ab, 3: _add_predicted,
               4: _add_checked_and_listing_indexes, 5: _add_report_claims, 6: _add_bisect,
               7: _add_tune, 8: _add_numerics}
