"""The results store on real SQLite and real PostgreSQL: round trips, idempotence,
concurrent writers, ordering and filters, and what a user sees when it is down."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
import results_fixtures
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, figure_key, make_run, outcome
from sqlalchemy import create_engine, update
from sqlalchemy.engine import make_url

from harness.results.model import BuildRef, Hardware, RunRecord
from harness.results.store import (
    ResultsStore,
    ResultsStoreError,
    default_url,
    open_store,
    schema_version,
)

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


def test_full_run_round_trips(store: ResultsStore) -> None:
    run = _full_run()
    assert store.add_run(run) is True
    assert store.get_run(run.run_id) == run
    assert store.list_runs() == [run]


def test_empty_run_round_trips(store: ResultsStore) -> None:
    run = make_run("bare")
    assert store.add_run(run)
    assert store.get_run("bare") == run


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
