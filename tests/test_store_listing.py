"""What the results store reads to list runs, on real SQLite and real PostgreSQL.

Issue 24: the service's listings must stay fast at 10,000 main-job runs. So a summary
listing reads no figures and parses no run body, a run add_run checked is not checked
again, a run stored before that check existed is checked once per store, and each
filter of a listing has an index that gives its order (store schema 5, migrated from 4).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import results_fixtures
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, figure_key, make_run, outcome
from sqlalchemy import Engine, create_engine, event, inspect, select, text, update
from sqlalchemy.engine import make_url

from harness.results import store_reading
from harness.results.run_record import RunRecord
from harness.results.run_validation import run_from_json
from harness.results.store import ResultsStore, open_store
from harness.results.store_tables import (
    FIGURES_BY_METRIC,
    LISTING_INDEXES,
    STORE_SCHEMA_VERSION,
    runs,
    schema_version,
)

store_url = results_fixtures.store_url
store = results_fixtures.store


def _runs() -> list[RunRecord]:
    """Runs on two branches and two hardware, each with outcomes and figures."""
    found = []
    for minute in range(8):
        found.append(make_run(
            f"run-{minute}", branch="main" if minute % 2 else "pr/7", started_at=at(minute),
            hardware=CPU_BOX if minute % 4 < 2 else GPU_BOX,
            outcomes=[outcome("suites/test_a.py::test_ok"),
                      outcome("suites/test_a.py::test_off", "skipped"),
                      *([outcome("suites/test_a.py::test_bad", "failed", message="no")]
                        if minute == 5 else [])],
            figures=[fig("decode_tps", 100.0 + minute),
                     fig("load_s", 0.5, key=figure_key(fixture="dense")),
                     fig("decode_tps", 101.0 + minute, test_id="suites/test_b.py::test_x")]))
    # Two runs that start at the same moment are listed in the order they were stored.
    found.append(make_run("run-tie", branch="main", started_at=at(7), hardware=GPU_BOX))
    return found


def _engine(url: str) -> Engine:
    return create_engine(url.replace("postgresql://", "postgresql+psycopg://"))


@contextmanager
def _statements() -> Iterator[list[tuple[str, Any]]]:
    """Every SQL statement any engine sends while the block runs, with its parameters."""
    sent: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, context: Any,
               executemany: bool) -> None:
        sent.append((statement, parameters))

    event.listen(Engine, "before_cursor_execute", record)
    try:
        yield sent
    finally:
        event.remove(Engine, "before_cursor_execute", record)


def _forbid_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    def parsed(*args: Any, **kwargs: Any) -> RunRecord:
        raise AssertionError("a run was checked against the run.json schema again")
    monkeypatch.setattr(store_reading, "run_from_json", parsed)


@pytest.mark.parametrize("filters", [
    {}, {"branch": "main"}, {"hardware": GPU_BOX.identity},
    {"branch": "main", "hardware": GPU_BOX.identity}, {"limit": 3},
    {"branch": "main", "limit": 2, "before_run": "run-7"},
], ids=["all", "branch", "hardware", "both", "limit", "before"])
def test_summaries_list_what_list_runs_lists(store: ResultsStore,
                                             filters: dict[str, Any]) -> None:
    for run in _runs():
        store.add_run(run)
    records = store.list_runs(**filters)
    summaries = store.list_summaries(**filters)
    assert records
    assert [(s.run_id, s.branch, s.commit, s.started_at, s.finished_at, s.hardware, s.build)
            for s in summaries] == [
        (r.run_id, r.branch, r.commit, r.started_at, r.finished_at, r.hardware, r.build)
        for r in records]
    for summary, record in zip(summaries, records, strict=True):
        words = [o.outcome.value for o in record.outcomes]
        assert summary.outcome_counts == {w: words.count(w) for w in set(words)}


def test_a_summary_listing_reads_no_figures_and_parses_no_run(
        store: ResultsStore, monkeypatch: pytest.MonkeyPatch) -> None:
    for run in _runs():
        store.add_run(run)
    _forbid_parsing(monkeypatch)
    with _statements() as sent:
        listed = store.list_summaries(branch="main", limit=3)
    assert [s.run_id for s in listed] == ["run-tie", "run-7", "run-5"]
    assert listed[2].outcome_counts == {"passed": 1, "skipped": 1, "failed": 1}
    assert sent
    assert not [statement for statement, _ in sent if "figures" in statement]


def test_a_run_stored_checked_is_read_without_the_schema(
        store: ResultsStore, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = _runs()
    for run in stored:
        store.add_run(run)
    _forbid_parsing(monkeypatch)
    assert store.get_run("run-5") == stored[5]
    assert store.list_runs() == sorted(stored, key=lambda r: (r.started_at, stored.index(r)),
                                       reverse=True)


def test_a_run_stored_before_checking_is_checked_once_per_store(
        store: ResultsStore, store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    stored = _runs()
    for run in stored:
        store.add_run(run)
    engine = _engine(store_url)
    with engine.begin() as conn:  # as a harness before store schema 5 left them
        conn.execute(update(runs).where(runs.c.run_id.in_(["run-3", "run-5"]))
                     .values(checked=None))
    engine.dispose()
    checked: list[str] = []

    def counting(body: Any, *, source: str) -> RunRecord:
        checked.append(body["run_id"])
        return run_from_json(body, source=source)

    monkeypatch.setattr(store_reading, "run_from_json", counting)
    assert [s.run_id for s in store.list_summaries()] == [r.run_id for r in store.list_runs()]
    assert store.get_run("run-5") == stored[5]
    assert set(store.figures_of(["run-3", "run-5"])) == {"run-3", "run-5"}
    assert sorted(checked) == ["run-3", "run-5"]
    # Another store object remembers nothing: it checks them again, once.
    with open_store(store_url) as other:
        other.list_runs()
        other.list_summaries()
    assert sorted(checked) == ["run-3", "run-3", "run-5", "run-5"]


def test_figures_of_keeps_the_run_order_and_filters_by_metric_and_key(store: ResultsStore) -> None:
    stored = {run.run_id: run for run in _runs()}
    for run in stored.values():
        store.add_run(run)
    every = store.figures_of(["run-2", "run-1", "no-such-run", "run-tie"])
    assert list(every) == ["run-2", "run-1", "run-tie"]
    assert every["run-2"] == stored["run-2"].figures
    assert every["run-tie"] == ()
    decode = store.figures_of(["run-1"], metric="decode_tps")
    assert decode == {"run-1": tuple(f for f in stored["run-1"].figures
                                     if f.metric == "decode_tps")}
    dense = figure_key(fixture="dense")
    assert store.figures_of(["run-1", "run-2"], key=dense.label()) == {
        run_id: tuple(f for f in stored[run_id].figures if f.key == dense)
        for run_id in ("run-1", "run-2")}
    assert store.figures_of(["run-1"], metric="decode_tps", key=dense.label()) == {
        "run-1": ()}
    assert store.figures_of([]) == {}


# -- the listing indexes --------------------------------------------------------------------

def _index_names(url: str, table: str = "runs") -> set[str]:
    engine = _engine(url)
    try:
        return {str(index["name"]) for index in inspect(engine).get_indexes(table)}
    finally:
        engine.dispose()


def test_a_version_4_store_gains_the_listing_indexes_and_checks_its_runs_on_read(
        store_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    old = _runs()[5]
    with open_store(store_url) as current:
        assert current.add_run(old)
    engine = _engine(store_url)
    with engine.begin() as conn:  # back to what schema 4 held
        for index in (*LISTING_INDEXES[1:], FIGURES_BY_METRIC):
            conn.execute(text(f"DROP INDEX {index.name}"))
        conn.execute(text("CREATE INDEX ix_runs_branch ON runs (branch)"))
        conn.execute(text("CREATE INDEX ix_runs_hardware ON runs (hardware_identity)"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN checked"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN bisect"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN tune"))
        conn.execute(text("ALTER TABLE runs DROP COLUMN numerics"))
        conn.execute(update(schema_version).values(version=4))
    engine.dispose()
    assert "ix_runs_branch" in _index_names(store_url)

    checked: list[str] = []

    def counting(body: Any, *, source: str) -> RunRecord:
        checked.append(body["run_id"])
        return run_from_json(body, source=source)

    monkeypatch.setattr(store_reading, "run_from_json", counting)
    new = make_run("after-migration", started_at=at(9))
    with open_store(store_url) as migrated:
        assert migrated.add_run(new)
        assert migrated.list_runs() == [new, old]
        assert [s.run_id for s in migrated.list_summaries()] == [new.run_id, old.run_id]
    # The run stored before schema 5 was checked when read; the new one was not.
    assert checked == [old.run_id]
    names = _index_names(store_url)
    assert {str(index.name) for index in LISTING_INDEXES} <= names
    assert not names & {"ix_runs_branch", "ix_runs_hardware"}
    assert FIGURES_BY_METRIC.name in _index_names(store_url, "figures")
    engine = _engine(store_url)
    with engine.connect() as conn:
        marks = dict(conn.execute(select(runs.c.run_id, runs.c.checked)).all())
        version = conn.execute(select(schema_version.c.version)).scalars().all()
    engine.dispose()
    assert marks == {old.run_id: None, new.run_id: True}
    assert version == [STORE_SCHEMA_VERSION]  # migrated through every later step too


@pytest.mark.parametrize(("filters", "index"), [
    ({}, "ix_runs_order"),
    ({"branch": "main"}, "ix_runs_branch_order"),
    ({"hardware": CPU_BOX.identity}, "ix_runs_hardware_order"),
    ({"branch": "main", "hardware": CPU_BOX.identity}, "ix_runs_branch_hardware_order"),
    ({"branch": "main", "hardware": CPU_BOX.identity, "before_run": "run-5"},
     "ix_runs_branch_hardware_order"),
], ids=["all", "branch", "hardware", "both", "before"])
def test_each_sqlite_listing_reads_its_page_from_one_index(
        tmp_path: Any, filters: dict[str, Any], index: str) -> None:
    """No listing sorts its matching runs: SQLite's plan walks the index in order.

    (PostgreSQL picks its plan from table statistics: with a handful of rows it reads
    the table, so only the indexes' presence is checked there, by the migration test.)
    """
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(url) as opened:
        for run in _runs():
            opened.add_run(run)
        with _statements() as sent:
            opened.list_summaries(limit=2, **filters)
    listing = [(s, p) for s, p in sent if "ORDER BY runs.started_at DESC" in s]
    assert listing
    path = make_url(url).database
    assert path is not None
    with sqlite3.connect(path) as conn:
        for statement, parameters in listing:
            plan = " | ".join(row[3] for row in conn.execute(
                "EXPLAIN QUERY PLAN " + statement, parameters))
            assert f"INDEX {index}" in plan, plan
            assert "TEMP B-TREE" not in plan, plan


def test_a_sqlite_history_of_one_metric_reads_only_that_metrics_figures(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(url) as opened:
        for run in _runs():
            opened.add_run(run)
        with _statements() as sent:
            opened.figures_of(["run-1", "run-3"], metric="decode_tps")
    reads = [(s, p) for s, p in sent if "FROM figures" in s]
    assert len(reads) == 1
    path = make_url(url).database
    assert path is not None
    with sqlite3.connect(path) as conn:
        statement, parameters = reads[0]
        plan = " | ".join(row[3] for row in conn.execute(
            "EXPLAIN QUERY PLAN " + statement, parameters))
    assert f"INDEX {FIGURES_BY_METRIC.name} (run_id=? AND metric=?)" in plan, plan
    assert "TEMP B-TREE" not in plan, plan
