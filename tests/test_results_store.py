"""The results store on real SQLite and real PostgreSQL: round trips, idempotence,
concurrent writers, ordering and filters, what a user sees when it is down, runs the
run.json schema refuses, report states, and migrating a store of an older version."""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

import pytest
import results_fixtures
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, figure_key, make_run, outcome
from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    select,
    update,
)
from sqlalchemy.engine import make_url

from harness.results.comparison import compare_tests
from harness.results.run_record import BuildRef, Hardware, RunRecord
from harness.results.run_validation import RunRecordError
from harness.results.store import ResultsStore, open_store
from harness.results.store_backends import ResultsStoreError, default_url
from harness.results.store_rows import ReportState
from harness.results.store_tables import STORE_SCHEMA_VERSION, figures, runs, schema_version

# Shared fixtures (tests/ has no conftest.py): each test runs on SQLite and PostgreSQL.
store_url = results_fixtures.store_url
store = results_fixtures.store


def _full_run(run_id: str = "run-full") -> RunRecord:
    return make_run(
        run_id, branch="feature/kv-quant", started_at=at(5), hardware=GPU_BOX,
        build=BuildRef(backend="cuda", version="version: 5001 (1234abcd)",
                       source_digest="f" * 64, build_key="cuda-feedbeef",
                       image_digest="sha256:" + "a" * 64),
        outcomes=[outcome("suites/test_smoke.py::test_ready", duration_s=1.25),
                  outcome("suites/test_smoke.py::test_bad", "failed",
                          message="AssertionError: 3 != 4\nsecond line | pipe"),
                  outcome("suites/test_gpu_unused.py::test_x", "skipped", message=None)],
        figures=[fig("decode_tps", 1234.5678),
                 fig("decode_tps", 1230.0),
                 fig("ttft_ms", 12.0625, key=figure_key(n_prompt=512, flash_attn="on")),
                 fig("kv_mib", 64.0, test_id="suites/test_kv.py::test_size",
                     key=figure_key(cache_type_k="q8_0", offload="moe-cpu"))],
        labels={"ci": "nightly", "pr": "1234"})


def _ab_result() -> dict[str, Any]:
    """An ``ab`` object shaped as harness/ab/report.py's record_json writes it."""
    return {
        "baseline": "build cpu-0123456789ab", "candidate": "build cpu-feedbeef0000",
        "design": "duet", "threshold": 0.03,
        "metrics": {
            "prompt_tps": {"verdict": "unchanged", "pairs": 12, "ratio": 1.0025,
                           "ci_low": 0.99, "ci_high": 1.015},
            "decode_tps": {"verdict": "regressed", "pairs": 16, "ratio": 0.9012,
                           "ci_low": 0.8875, "ci_high": 0.9150},
            "load_s": {"verdict": "unknown", "pairs": 0, "ratio": None, "ci_low": None,
                       "ci_high": None},
        },
        "counter_changes": [{"name": "greedy_text", "baseline": "Once upon a time | é",
                             "candidate": "Once upon a time\n\"quoted\""}],
    }


def _ab_run(run_id: str = "run-ab") -> RunRecord:
    return replace(_full_run(run_id), ab=_ab_result())


def _stored_ab(url: str, run_id: str) -> str | None:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        found = conn.execute(select(runs.c.ab).where(runs.c.run_id == run_id)).scalar_one()
    engine.dispose()
    return None if found is None else str(found)


def test_full_run_round_trips(store: ResultsStore) -> None:
    run = _full_run()
    assert store.add_run(run) is True
    assert store.get_run(run.run_id) == run
    assert store.list_runs() == [run]


def test_empty_run_round_trips(store: ResultsStore) -> None:
    run = make_run("bare")
    assert store.add_run(run)
    assert store.get_run("bare") == run


def test_a_run_with_an_ab_result_round_trips(store: ResultsStore, store_url: str) -> None:
    run, plain = _ab_run(), _full_run()
    assert store.add_run(run)
    assert store.add_run(plain)
    assert store.get_run(run.run_id) == run
    assert store.list_runs() == [plain, run]  # same start: the later stored first
    got = store.get_run(run.run_id)
    assert got is not None
    assert got.ab == _ab_result()
    # JSON text with sorted keys; NULL, not "null", for a run without an A/B result.
    assert _stored_ab(store_url, run.run_id) == json.dumps(
        _ab_result(), sort_keys=True, separators=(",", ":"))
    assert _stored_ab(store_url, plain.run_id) is None
    fetched = store.get_run(plain.run_id)
    assert fetched is not None
    assert "ab" not in fetched.to_json()


def test_unknown_run_is_none(store: ResultsStore) -> None:
    assert store.get_run("nope") is None
    assert store.latest_run() is None


def test_add_run_is_idempotent(store: ResultsStore) -> None:
    run = _full_run()
    assert store.add_run(run) is True
    assert store.add_run(run) is False
    # Nothing doubled: the outcomes and figures read back exactly once.
    assert store.get_run(run.run_id) == run
    assert len(store.list_runs()) == 1


def test_reopening_keeps_runs(store_url: str) -> None:
    with open_store(store_url) as first:
        first.add_run(_full_run())
    with open_store(store_url) as second:
        assert second.get_run("run-full") == _full_run()


def _at_once(count: int, work: Callable[[int], bool]) -> list[bool]:
    """Run ``work(i)`` on ``count`` threads released together; their results in order."""
    barrier = threading.Barrier(count)
    results: list[bool | None] = [None] * count
    errors: list[BaseException] = []

    def body(i: int) -> None:
        try:
            barrier.wait(timeout=30)
            results[i] = work(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    assert all(r is not None for r in results)
    return [bool(r) for r in results]


def _numbered(i: int) -> RunRecord:
    return make_run(f"run-{i}", started_at=at(i), figures=[fig("decode_tps", 1000.0 + i)],
                    outcomes=[outcome(f"t{i}"), outcome("shared")])


def test_threads_adding_different_runs_lose_nothing(store: ResultsStore) -> None:
    added = _at_once(10, lambda i: store.add_run(_numbered(i)))
    assert added == [True] * 10
    assert store.list_runs() == [_numbered(i) for i in reversed(range(10))]


def test_threads_adding_the_same_run_store_it_once(store: ResultsStore) -> None:
    run = _full_run()
    added = _at_once(10, lambda _: store.add_run(run))
    assert sorted(added) == [False] * 9 + [True]
    assert store.list_runs() == [run]


def test_separate_stores_opening_and_writing_at_once(store_url: str) -> None:
    """Like separate processes: each opens the fresh store (creating its tables) and adds."""
    def work(i: int) -> bool:
        with open_store(store_url) as own:
            return own.add_run(_numbered(i % 5))

    added = _at_once(10, work)
    assert sorted(added) == [False] * 5 + [True] * 5
    with open_store(store_url) as check:
        assert check.list_runs() == [_numbered(i) for i in reversed(range(5))]


def test_list_runs_orders_newest_first_and_filters(store: ResultsStore) -> None:
    runs = {
        "m1": make_run("m1", started_at=at(1)),
        "m3": make_run("m3", started_at=at(3)),
        "m2": make_run("m2", started_at=at(2)),
        "f2": make_run("f2", branch="feature", started_at=at(2)),
        "g4": make_run("g4", started_at=at(4), hardware=GPU_BOX),
        # Same start as m3, stored later: newer in the order.
        "m3b": make_run("m3b", started_at=at(3)),
    }
    for run in runs.values():
        assert store.add_run(run)

    def ids(found: list[RunRecord]) -> list[str]:
        return [run.run_id for run in found]

    assert ids(store.list_runs()) == ["g4", "m3b", "m3", "f2", "m2", "m1"]
    assert ids(store.list_runs(branch="main")) == ["g4", "m3b", "m3", "m2", "m1"]
    assert ids(store.list_runs(hardware=CPU_BOX.identity)) == ["m3b", "m3", "f2", "m2", "m1"]
    assert ids(store.list_runs(hardware=GPU_BOX.identity)) == ["g4"]
    assert ids(store.list_runs(limit=2)) == ["g4", "m3b"]
    assert ids(store.list_runs(before_run="m3b")) == ["m3", "f2", "m2", "m1"]
    assert ids(store.list_runs(before_run="m3", branch="main", limit=1)) == ["m2"]
    assert ids(store.list_runs(before_run="m1")) == []
    assert ids(store.list_runs(branch="none")) == []
    latest = store.latest_run(branch="main", hardware=CPU_BOX.identity)
    assert latest is not None
    assert latest.run_id == "m3b"
    assert store.branches() == ["main", "feature"]


def test_hardware_filter_ignores_host_name(store: ResultsStore) -> None:
    other_host = make_run("h2", hardware=Hardware(host="ci-2", cpu=CPU_BOX.cpu))
    store.add_run(other_host)
    assert [r.run_id for r in store.list_runs(hardware=CPU_BOX.identity)] == ["h2"]


def test_before_unknown_run_is_an_error(store: ResultsStore) -> None:
    with pytest.raises(ResultsStoreError, match="no run 'ghost'"):
        store.list_runs(before_run="ghost")


def test_store_written_by_a_newer_harness_is_refused(store_url: str) -> None:
    with open_store(store_url):
        pass
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(update(schema_version).values(version=99))
    engine.dispose()
    with pytest.raises(ResultsStoreError, match="schema 99"):
        open_store(store_url)


def test_unreachable_postgres_names_host_not_password() -> None:
    with pytest.raises(ResultsStoreError) as caught:
        open_store("postgresql://harness:s3cret-pw@127.0.0.1:1/results")
    message = str(caught.value)
    assert "127.0.0.1:1" in message
    assert "HARNESS_RESULTS_URL" in message
    assert "s3cret-pw" not in message
    assert "***" in message


def test_sqlite_in_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'no-such-dir' / 'results.sqlite'}"
    with pytest.raises(ResultsStoreError, match="no-such-dir"):
        open_store(url)


@pytest.mark.parametrize("url", ["mysql://u:pw@127.0.0.1/db", "sqlite://", "not a url"])
def test_unsupported_urls_are_refused(url: str) -> None:
    with pytest.raises(ResultsStoreError, match="sqlite:///PATH") as caught:
        open_store(url)
    assert ":pw@" not in str(caught.value)


def test_default_url_prefers_the_environment(monkeypatch: pytest.MonkeyPatch,
                                             tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_RESULTS_URL", "postgresql://u@127.0.0.1/results")
    assert default_url() == "postgresql://u@127.0.0.1/results"
    monkeypatch.delenv("HARNESS_RESULTS_URL")
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    assert default_url() == f"sqlite:///{tmp_path / 'cache' / 'results.sqlite'}"
    assert (tmp_path / "cache").is_dir()


def test_display_url_hides_the_password(store_url: str) -> None:
    password = make_url(store_url).password
    with open_store(store_url) as opened:
        if password:
            assert f":{password}@" not in opened.url_for_display
            assert ":***@" in opened.url_for_display
        else:
            assert opened.url_for_display == store_url


# -- runs the run.json schema refuses ---------------------------------------------------

@pytest.mark.parametrize(("bad", "field"), [
    (make_run("nan", figures=[fig("decode_tps", math.nan)]), "$.figures[0].value"),
    (make_run("inf", outcomes=[outcome("t", duration_s=math.inf)]),
     "$.outcomes[0].duration_s"),
    (make_run("nul", branch="main\x00"), "$.branch"),
    (make_run("nul-message", outcomes=[outcome("t", "failed", message="a\x00b")]),
     "$.outcomes[0].message"),
    (make_run("bool", figures=[fig("kv_mib", 1.0, key=figure_key(n_gen=True))]),
     "$.figures[0].key.n_gen"),
    (make_run("big", figures=[fig("kv_mib", 1.0, key=figure_key(n_prompt=2**31))]),
     "$.figures[0].key.n_prompt"),
    (replace(make_run("ab-nan"), ab={**_ab_result(), "threshold": math.nan}),
     "$.ab.threshold"),
    (replace(make_run("ab-metric"), ab={**_ab_result(), "metrics": {"fps": {}}}),
     "$.ab.metrics.fps"),
], ids=["nan", "inf", "nul-branch", "nul-message", "bool-as-number", "int32-overflow",
        "ab-nan", "ab-unknown-metric"])
def test_a_run_the_schema_refuses_is_not_stored(store: ResultsStore, bad: RunRecord,
                                                field: str) -> None:
    earlier = _full_run()
    store.add_run(earlier)
    with pytest.raises(RunRecordError) as caught:
        store.add_run(bad, report=ReportState("pending", queued_ns=1))
    assert caught.value.field == field
    assert not isinstance(caught.value, ResultsStoreError)
    assert store.get_run(bad.run_id) is None
    assert store.list_runs() == [earlier]
    assert store.report_states([bad.run_id]) == {}


def test_a_run_stored_before_the_schema_that_breaks_it_is_skipped(
        store: ResultsStore, store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    good, infinite, nan = _numbered(1), _numbered(2), _numbered(3)
    for run in (good, infinite, nan):
        store.add_run(run)
    # What an older harness let in: SQLite keeps inf (and turns NaN into NULL), and
    # JSON text columns took whatever json.dumps wrote, NaN included. Such a harness
    # left runs.checked NULL: it is what has those runs checked again when read.
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(update(figures).where(figures.c.run_id == infinite.run_id)
                     .values(value=math.inf))
        conn.execute(update(runs).where(runs.c.run_id == nan.run_id)
                     .values(hardware='{"host": "h", "cpu": "c", "vram_mib": NaN}'))
        conn.execute(update(runs).values(checked=None))
    engine.dispose()
    with caplog.at_level(logging.WARNING, logger="harness.results.store"):
        assert store.list_runs() == [good]
        assert store.get_run(nan.run_id) is None
        # The two newest are broken: a page of one reads on past them.
        assert store.list_runs(limit=1) == [good]
        assert store.latest_run() == good
        assert store.list_runs(limit=2, before_run=nan.run_id) == [good]
        assert [s.run_id for s in store.list_summaries()] == [good.run_id]
        assert [s.run_id for s in store.list_summaries(limit=1)] == [good.run_id]
        assert list(store.figures_of([nan.run_id, infinite.run_id, good.run_id])) == [
            good.run_id]
    assert infinite.run_id in caplog.text
    assert "$.figures[0].value" in caplog.text
    assert nan.run_id in caplog.text
    assert "$.hardware.vram_mib" in caplog.text


def test_a_run_whose_stored_ab_result_breaks_the_schema_is_skipped(
        store: ResultsStore, store_url: str, caplog: pytest.LogCaptureFixture) -> None:
    good, bad_metric, not_json = _numbered(1), _ab_run("bad-metric"), _ab_run("not-json")
    for run in (good, bad_metric, not_json):
        store.add_run(run)
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(update(runs).where(runs.c.run_id == bad_metric.run_id).values(
            ab=json.dumps({**_ab_result(), "metrics": {"fps": {}}})))
        conn.execute(update(runs).where(runs.c.run_id == not_json.run_id).values(ab="{"))
        conn.execute(update(runs).values(checked=None))  # as an older harness left them
    engine.dispose()
    with caplog.at_level(logging.WARNING, logger="harness.results.store"):
        assert store.list_runs() == [good]
    assert "$.ab.metrics.fps" in caplog.text
    assert not_json.run_id in caplog.text


# -- report states ------------------------------------------------------------------------

def test_a_run_is_stored_with_its_report_state(store: ResultsStore) -> None:
    run = _full_run()
    pending = ReportState("pending", queued_ns=time.time_ns(), updated_at=at(6))
    assert store.add_run(run, report=pending) is True
    assert store.report_states([run.run_id]) == {run.run_id: pending}
    assert store.runs_awaiting_report() == [run.run_id]
    assert store.runs_without_report() == []


def test_a_run_already_stored_keeps_its_report_state(store: ResultsStore) -> None:
    run = _full_run()
    ready = ReportState("ready", updated_at=at(7))
    store.add_run(run, report=ready)
    # The run's insert fails on its unique id, and the report row goes with it.
    assert store.add_run(run, report=ReportState("pending", queued_ns=5)) is False
    assert store.report_states([run.run_id]) == {run.run_id: ready}
    bare = make_run("bare")
    store.add_run(bare)
    assert store.add_run(bare, report=ReportState("pending", queued_ns=5)) is False
    assert store.report_states([bare.run_id]) == {}


def test_set_report_state_inserts_then_updates(store: ResultsStore) -> None:
    run = _full_run()
    store.add_run(run)
    pending = ReportState("pending", queued_ns=2**62, updated_at=at(1))
    store.set_report_state(run.run_id, pending)
    assert store.report_states([run.run_id]) == {run.run_id: pending}
    failed = ReportState("failed", message="allure: exit 1\nno results",
                         problems=("allure-results/a.json: not JSON", "ünïcode"),
                         queued_ns=2**62, updated_at=at(2))
    store.set_report_state(run.run_id, failed)
    assert store.report_states([run.run_id]) == {run.run_id: failed}
    assert store.runs_awaiting_report() == []


def test_threads_setting_a_new_report_state_at_once(store: ResultsStore) -> None:
    run = _full_run()
    store.add_run(run)
    states = [ReportState("ready", message=f"writer {i}") for i in range(8)]
    def work(i: int) -> bool:
        store.set_report_state(run.run_id, states[i])
        return True

    assert _at_once(8, work) == [True] * 8
    assert store.report_states([run.run_id])[run.run_id] in states


def test_a_report_state_for_an_unknown_run_is_an_error(store: ResultsStore) -> None:
    with pytest.raises(ResultsStoreError, match="no run 'ghost'"):
        store.set_report_state("ghost", ReportState("pending"))


def test_report_states_leaves_out_runs_without_one(store: ResultsStore) -> None:
    for i in range(3):
        store.add_run(_numbered(i))
    store.set_report_state("run-0", ReportState("ready"))
    store.set_report_state("run-2", ReportState("failed", message="boom"))
    assert store.report_states(["run-0", "run-1", "run-2", "ghost", "run-0"]) == {
        "run-0": ReportState("ready"), "run-2": ReportState("failed", message="boom")}
    assert store.report_states([]) == {}


def test_runs_awaiting_report_oldest_queued_first(store: ResultsStore) -> None:
    queued = {"run-0": 30, "run-1": 10, "run-2": 10, "run-3": 5}
    for i in range(5):
        store.add_run(_numbered(i))
    for run_id, at_ns in queued.items():
        store.set_report_state(run_id, ReportState("pending", queued_ns=at_ns))
    store.set_report_state("run-3", ReportState("ready", queued_ns=5))
    # run-1 and run-2 were queued together: the one stored first goes first.
    assert store.runs_awaiting_report() == ["run-1", "run-2", "run-0"]


def test_runs_without_report_in_order_of_storing(store: ResultsStore) -> None:
    for i in (3, 1, 2, 0):
        store.add_run(_numbered(i))
    store.set_report_state("run-1", ReportState("pending"))
    assert store.runs_without_report() == ["run-3", "run-2", "run-0"]


def test_a_report_state_outside_the_known_ones_is_refused() -> None:
    with pytest.raises(ValueError, match="pending, ready"):
        ReportState("done")
    with pytest.raises(ValueError, match="BIGINT"):
        ReportState("pending", queued_ns=2**63)


def test_a_nul_in_a_report_message_is_stored_on_both_backends(store: ResultsStore) -> None:
    store.add_run(make_run("nul-report"))
    store.set_report_state("nul-report", ReportState("failed", message="a\x00b",
                                                     problems=("c\x00d",)))
    assert store.report_states(["nul-report"])["nul-report"] == ReportState(
        "failed", message="a\ufffdb", problems=("c\x00d",))


# -- schema versions ---------------------------------------------------------------------

def _v1_metadata() -> MetaData:
    """The tables of store schema 1, frozen here as that version created them."""
    v1 = MetaData()
    Table("schema_version", v1, Column("version", Integer, primary_key=True,
                                       autoincrement=False))
    Table("runs", v1,
          Column("seq", Integer, primary_key=True, autoincrement=True),
          Column("run_id", String(), nullable=False, unique=True),
          *(Column(name, String(), nullable=False) for name in (
              "branch", "commit", "started_at", "finished_at", "hardware_identity")),
          Column("hardware", Text, nullable=False), Column("build", Text, nullable=False),
          Column("harness_version", String(), nullable=False),
          Column("labels", Text, nullable=False))
    Table("outcomes", v1,
          Column("run_id", String(), ForeignKey("runs.run_id", ondelete="CASCADE"),
                 primary_key=True),
          Column("position", Integer, primary_key=True, autoincrement=False),
          Column("test_id", Text, nullable=False), Column("outcome", String(), nullable=False),
          Column("duration_s", Float, nullable=False), Column("message", Text))
    Table("figures", v1,
          Column("run_id", String(), ForeignKey("runs.run_id", ondelete="CASCADE"),
                 primary_key=True),
          Column("position", Integer, primary_key=True, autoincrement=False),
          Column("test_id", Text, nullable=False), Column("metric", String(), nullable=False),
          Column("value", Float, nullable=False),
          *(Column(name, String(), nullable=False) for name in (
              "hardware_identity", "build_key", "fixture", "backend", "gpu", "n_gpu_layers",
              "cache_type_k", "cache_type_v", "flash_attn", "offload")),
          Column("n_prompt", Integer, nullable=False), Column("n_gen", Integer, nullable=False))
    return v1


def _v2_metadata() -> MetaData:
    """The tables of store schema 2 (schema 1 and reports), frozen as that version made them."""
    v2 = _v1_metadata()
    Table("reports", v2,
          Column("run_id", String(), ForeignKey("runs.run_id", ondelete="CASCADE"),
                 primary_key=True),
          Column("state", String(), nullable=False), Column("message", Text),
          Column("problems", Text, nullable=False),
          Column("queued_ns", BigInteger, nullable=False),
          Column("updated_at", String(), nullable=False),
          Index("ix_reports_state", "state", "queued_ns"))
    return v2


def _write_v1_store(url: str, run: RunRecord) -> None:
    """A store as harness schema 1 left it, holding ``run``."""
    _write_old_store(url, run, 1)


def _write_v2_store(url: str, run: RunRecord, report: ReportState) -> None:
    """A store as harness schema 2 left it, holding ``run`` with its report state."""
    _write_old_store(url, run, 2, report)


def _write_old_store(url: str, run: RunRecord, version: int,
                     report: ReportState | None = None) -> None:
    v1 = _v1_metadata() if version == 1 else _v2_metadata()
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    if url.startswith("sqlite"):
        # Version 1 switched every SQLite store to WAL on its first connection, too.
        with engine.connect() as conn:
            conn.exec_driver_sql("PRAGMA journal_mode = WAL")
    with engine.begin() as conn:
        v1.create_all(conn)
        conn.execute(v1.tables["schema_version"].insert().values(version=version))
        conn.execute(v1.tables["runs"].insert().values(
            run_id=run.run_id, branch=run.branch, commit=run.commit,
            started_at=run.started_at, finished_at=run.finished_at,
            hardware_identity=run.hardware.identity,
            hardware=json.dumps(asdict(run.hardware)), build=json.dumps(asdict(run.build)),
            harness_version=run.harness_version, labels=json.dumps(run.labels)))
        conn.execute(v1.tables["outcomes"].insert(), [
            {"run_id": run.run_id, "position": i, **asdict(o)}
            for i, o in enumerate(run.outcomes)])
        conn.execute(v1.tables["figures"].insert(), [
            {"run_id": run.run_id, "position": i, "test_id": f.test_id, "metric": f.metric,
             "value": f.value, "hardware_identity": run.hardware.identity,
             "build_key": run.build.build_key, **asdict(f.key)}
            for i, f in enumerate(run.figures)])
        if report is not None:
            conn.execute(v1.tables["reports"].insert().values(
                run_id=run.run_id, state=report.state, message=report.message,
                problems=json.dumps(list(report.problems)), queued_ns=report.queued_ns,
                updated_at=report.updated_at))
    engine.dispose()


def _stored_version(url: str) -> list[int]:
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        found = [int(v) for v in conn.execute(select(schema_version.c.version)).scalars()]
    engine.dispose()
    return found


def test_a_version_1_store_is_migrated_to_the_current_version(store_url: str) -> None:
    old = _full_run()
    _write_v1_store(store_url, old)
    with open_store(store_url) as migrated:
        assert migrated.get_run(old.run_id) == old
        assert migrated.runs_without_report() == [old.run_id]
        migrated.set_report_state(old.run_id, ReportState("pending", queued_ns=time.time_ns()))
        assert migrated.runs_awaiting_report() == [old.run_id]
        new = replace(make_run("after-migration", started_at=at(9)), ab=_ab_result())
        assert migrated.add_run(new, report=ReportState("ready"))
        assert migrated.list_runs() == [new, old]
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION] == [9]
    assert _stored_ab(store_url, old.run_id) is None
    # Opening it again changes nothing.
    with open_store(store_url) as again:
        assert again.report_states([new.run_id]) == {new.run_id: ReportState("ready")}
        assert again.get_run(new.run_id) == new
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]


def test_a_version_2_store_is_migrated_to_the_current_version(store_url: str) -> None:
    old = _full_run()
    report = ReportState("failed", message="allure crashed", problems=("p1",),
                         queued_ns=12345, updated_at=at(6))
    _write_v2_store(store_url, old, report)
    with open_store(store_url) as migrated:
        got = migrated.get_run(old.run_id)
        assert got == old
        assert got is not None
        assert got.ab is None
        assert migrated.report_states([old.run_id]) == {old.run_id: report}
        new = _ab_run("ab-after-migration")
        assert migrated.add_run(new)
        assert migrated.get_run(new.run_id) == new
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]
    assert _stored_ab(store_url, old.run_id) is None
    assert _stored_ab(store_url, new.run_id) is not None
    with open_store(store_url) as again:
        assert again.list_runs() == [new, old]
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]


def test_a_version_3_store_is_migrated_keeping_its_figures_and_storing_predictions(
        store_url: str) -> None:
    old = _full_run()
    with open_store(store_url) as current:
        assert current.add_run(old)
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:  # back to what schema 3 held: no figures.predicted
        conn.exec_driver_sql("ALTER TABLE figures DROP COLUMN predicted")
        conn.exec_driver_sql("ALTER TABLE runs DROP COLUMN checked")
        conn.exec_driver_sql("ALTER TABLE runs DROP COLUMN bisect")
        conn.exec_driver_sql("ALTER TABLE runs DROP COLUMN tune")
        conn.exec_driver_sql("ALTER TABLE runs DROP COLUMN numerics")
        conn.execute(update(schema_version).values(version=3))
    engine.dispose()
    predicted = replace(make_run("predicted", started_at=at(9)),
                        figures=(replace(fig("decode_tps", 100.0), predicted=125.0),))
    with open_store(store_url) as migrated:
        assert migrated.get_run(old.run_id) == old
        assert migrated.add_run(predicted)
        got = migrated.get_run(predicted.run_id)
    assert got == predicted
    assert got is not None
    assert got.figures[0].ratio == 0.8
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]


def test_separate_stores_migrating_a_version_2_store_at_once(store_url: str) -> None:
    old = _full_run()
    _write_v2_store(store_url, old, ReportState("ready"))

    def work(i: int) -> bool:
        with open_store(store_url) as own:
            return own.get_run(old.run_id) == old and own.add_run(_ab_run(f"ab-{i}"))

    assert _at_once(6, work) == [True] * 6
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]


def test_separate_stores_migrating_a_version_1_store_at_once(store_url: str) -> None:
    old = _full_run()
    _write_v1_store(store_url, old)

    def work(i: int) -> bool:
        with open_store(store_url) as own:
            return own.get_run(old.run_id) == old

    assert _at_once(6, work) == [True] * 6
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]


def test_a_store_of_the_next_version_is_refused_naming_both(store_url: str) -> None:
    with open_store(store_url):
        pass
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        conn.execute(update(schema_version).values(version=STORE_SCHEMA_VERSION + 1))
    engine.dispose()
    newer, ours = STORE_SCHEMA_VERSION + 1, STORE_SCHEMA_VERSION
    with pytest.raises(ResultsStoreError,
                       match=rf"has schema {newer}, newer than this harness's {ours}"):
        open_store(store_url)
    # Refused without a change: still the newer version.
    assert _stored_version(store_url) == [newer]


def test_a_run_stored_before_the_suites_moved_keeps_its_history(store: ResultsStore) -> None:
    """Runs stored when the suites were ``harness/suites/`` read back with the ids they
    have now, so a new run compares with them test by test (no test 'new' or 'removed')."""
    old_ids = ["harness/suites/test_smoke.py::test_ready", "tests/test_cli.py::test_help"]
    before = make_run("before-move", started_at=at(0),
                      outcomes=[outcome(old_ids[0]), outcome(old_ids[1], "failed")],
                      figures=[fig("decode_tps", 100.0,
                                   test_id="harness/suites/test_bench.py::test_speed")])
    assert store.add_run(before) is True
    read = store.get_run("before-move")
    assert read is not None
    assert [o.test_id for o in read.outcomes] == ["suites/test_smoke.py::test_ready",
                                                  "tests/test_cli.py::test_help"]
    assert [f.test_id for f in read.figures] == ["suites/test_bench.py::test_speed"]
    after = make_run("after-move", started_at=at(10),
                     outcomes=[outcome("suites/test_smoke.py::test_ready"),
                               outcome("tests/test_cli.py::test_help")],
                     figures=[fig("decode_tps", 101.0)])
    store.add_run(after)
    changes = compare_tests(read, after)
    assert changes["new_tests"] == changes["removed_tests"] == ()
    assert [c.test_id for c in changes["fixed"]] == ["tests/test_cli.py::test_help"]


BISECT = {
    "good": "a" * 40, "bad": "b" * 40, "oracle": "metric: decode_tps on bench", "commits": 3,
    "reproduced": True, "first_bad": {"sha": "b" * 40, "subject": "server: slower"},
    "candidates": [{"sha": "b" * 40, "subject": "server: slower"}], "stopped": None,
    "probes": [{"commit": "b" * 40, "subject": "server: slower", "verdict": "bad",
                "evidence": "decode_tps 0.880 [0.870, 0.890] vs good: regressed, 8 pairs",
                "build_key": "cpu-1", "build_s": 24.0, "judge_s": 11.0, "cache_hit": False}],
}


#: The runs columns each schema version added, newest last (store_tables.py).
_ADDED_RUNS_COLUMNS = {7: "bisect", 8: "tune", 9: "numerics"}


def _migrates_keeping(store_url: str, version: int, run: RunRecord) -> RunRecord:
    """A store with a full run, taken back to schema ``version`` (without the columns later
    versions added), then opened: ``run`` is added to it and read back."""
    old = _full_run()
    with open_store(store_url) as current:
        assert current.add_run(old)
    engine = create_engine(store_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.begin() as conn:
        for added, column in _ADDED_RUNS_COLUMNS.items():
            if added > version:
                conn.exec_driver_sql(f"ALTER TABLE runs DROP COLUMN {column}")
        conn.execute(update(schema_version).values(version=version))
    engine.dispose()
    with open_store(store_url) as migrated:
        assert migrated.get_run(old.run_id) == old
        assert migrated.add_run(run)
        got = migrated.get_run(run.run_id)
    assert got == run
    assert got is not None
    assert _stored_version(store_url) == [STORE_SCHEMA_VERSION]
    return got


def test_a_version_6_store_is_migrated_and_keeps_a_runs_bisect(store_url: str) -> None:
    explained = replace(make_run("explained", started_at=at(9)), bisect=BISECT)
    assert _migrates_keeping(store_url, 6, explained).bisect == BISECT


TUNE = {
    "card": "rtx-4090", "key": "model:llama", "context": "2048", "build_key": "cpu-1",
    "check": True, "threshold": 0.05, "stale": True,
    "current": ["ubatch_size 4", "batch_size 4"],
    "winner": {"name": "ubatch 256", "differs": ["ubatch_size 4 -> 256"],
               "figures": [{"metric": "prompt_tps", "verdict": "improved", "ratio": 3.8,
                            "low": 2.9, "high": 4.4, "pairs": 6}]},
    "candidates": [{"name": "ubatch 256", "differs": ["ubatch_size 4 -> 256"],
                    "verdict": "better",
                    "figures": [{"metric": "prompt_tps", "verdict": "improved",
                                 "ratio": 3.8, "low": 2.9, "high": 4.4, "pairs": 6}]}],
    "summary": "ubatch 256 beats the current plan",
}


def test_a_version_7_store_is_migrated_and_keeps_a_runs_tune(store_url: str) -> None:
    tuned = replace(make_run("tuned", started_at=at(9)), tune=TUNE)
    assert _migrates_keeping(store_url, 7, tuned).tune == TUNE


NUMERICS = {"suites/test_numerics.py::test_distributions_match_the_reference[bench-f16]": {
    "tokens": [3, 7], "rows": [{"3": -0.2, "7": -1.8}, None]}}


def test_a_version_8_store_is_migrated_and_keeps_a_runs_numerics(store_url: str) -> None:
    printed = replace(make_run("printed", started_at=at(9)), numerics=NUMERICS)
    assert _migrates_keeping(store_url, 8, printed).numerics == NUMERICS
