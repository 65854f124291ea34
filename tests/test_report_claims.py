"""Report jobs claimed by service replicas, on each backend: one job per history file at
a time, in the order the runs were stored; a lease that runs out frees the job; an
outcome counts only from the replica that still holds the claim."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import cast

import pytest
import results_fixtures
from results_fixtures import GPU_BOX, at, make_run
from test_service import bundle_bytes

from harness.errors import ConfigError
from harness.results.store import ResultsStore, open_store
from harness.results.store_rows import ReportState
from harness.service.ingest import Ingested, Ingestor
from harness.service.layout import Layout
from harness.service.settings import ServiceSettings

store = results_fixtures.store
store_url = results_fixtures.store_url


def _queue(store: ResultsStore, *runs: tuple[str, str]) -> None:
    """Store runs (id, branch) in order, each with its report pending."""
    for minute, (run_id, branch) in enumerate(runs):
        store.add_run(make_run(run_id, branch=branch, started_at=at(minute)),
                      report=ReportState("pending", queued_ns=time.time_ns()))


def test_one_job_per_branch_and_hardware_at_a_time_oldest_first(store: ResultsStore) -> None:
    _queue(store, ("main-1", "main"), ("main-2", "main"), ("dev-1", "dev"))
    first = store.claim_report("a", lease_s=60)
    second = store.claim_report("b", lease_s=60)
    # main-2 waits behind main-1 (one history file); dev-1 is free.
    assert (first, second) == ("main-1", "dev-1")
    assert store.claim_report("c", lease_s=60) is None
    assert store.finish_report("main-1", "a", ReportState("ready"))
    assert store.claim_report("c", lease_s=60) == "main-2"
    assert store.report_states(["main-1"])["main-1"].state == "ready"


def test_a_run_on_other_hardware_is_another_history(store: ResultsStore) -> None:
    store.add_run(make_run("cpu-1", started_at=at(1)),
                  report=ReportState("pending", queued_ns=1))
    store.add_run(make_run("gpu-1", started_at=at(2), hardware=GPU_BOX),
                  report=ReportState("pending", queued_ns=2))
    assert {store.claim_report("a", 60), store.claim_report("b", 60)} == {"cpu-1", "gpu-1"}


def test_a_lapsed_lease_is_taken_over_and_the_late_outcome_is_refused(
        store: ResultsStore) -> None:
    _queue(store, ("run-1", "main"))
    assert store.claim_report("dead", lease_s=1) == "run-1"
    assert store.claim_report("alive", lease_s=60) is None  # the lease still holds
    assert not store.renew_claim("run-1", "alive", lease_s=60)  # not its claim
    time.sleep(1.2)
    assert store.claim_report("alive", lease_s=60) == "run-1"
    # The replica that lost it cannot renew it or record an outcome any more.
    assert not store.renew_claim("run-1", "dead", lease_s=60)
    assert not store.finish_report("run-1", "dead", ReportState("failed", message="late"))
    assert store.renew_claim("run-1", "alive", lease_s=60)
    assert store.finish_report("run-1", "alive", ReportState("ready"))
    assert store.report_states(["run-1"])["run-1"] == ReportState("ready")


def test_a_restarted_replica_releases_only_its_own_claims(store: ResultsStore) -> None:
    _queue(store, ("a-1", "a"), ("b-1", "b"))
    assert store.claim_report("replica-a", 600) == "a-1"
    assert store.claim_report("replica-b", 600) == "b-1"
    assert store.release_claims("replica-a") == 1
    assert store.claim_report("replica-c", 600) == "a-1"
    assert store.claim_report("replica-c", 600) is None  # b-1 is still replica-b's


def test_queueing_a_run_again_ends_the_claim_on_it(store: ResultsStore) -> None:
    _queue(store, ("run-1", "main"))
    assert store.claim_report("a", 600) == "run-1"
    store.set_report_state("run-1", ReportState("pending", queued_ns=time.time_ns()))
    assert not store.finish_report("run-1", "a", ReportState("ready"))
    assert store.claim_report("b", 600) == "run-1"


def test_a_state_is_added_once(store: ResultsStore) -> None:
    store.add_run(make_run("stateless"))
    assert store.add_report_state("stateless", ReportState("pending", queued_ns=5))
    assert not store.add_report_state("stateless", ReportState("ready"))
    assert store.report_states(["stateless"])["stateless"].state == "pending"


def test_replicas_claiming_at_once_never_share_a_job_or_a_history(store_url: str) -> None:
    """Four claimers on their own connections, 40 jobs over 5 branches: each job is
    claimed once, and no two jobs of one branch are held at the same moment."""
    with open_store(store_url) as setup:
        _queue(setup, *[(f"run-{i:02d}", f"branch-{i % 5}") for i in range(40)])
    claimed: list[str] = []
    held: dict[str, str] = {}  # branch -> run being made
    overlaps: list[str] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def replica(name: str) -> None:
        try:
            with open_store(store_url) as mine:
                idle_since = time.monotonic()
                while time.monotonic() - idle_since < 2.0:
                    run_id = mine.claim_report(name, lease_s=600)
                    if run_id is None:
                        time.sleep(0.01)
                        continue
                    idle_since = time.monotonic()
                    branch = f"branch-{int(run_id[4:]) % 5}"
                    with lock:
                        claimed.append(run_id)
                        if branch in held:
                            overlaps.append(f"{run_id} while {held[branch]}")
                        held[branch] = run_id
                    time.sleep(0.005)  # making the report
                    with lock:
                        del held[branch]
                    assert mine.finish_report(run_id, name, ReportState("ready"))
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(f"replica-{n}",)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert overlaps == []
    assert Counter(claimed) == Counter(f"run-{i:02d}" for i in range(40))
    # Within a branch, in the order the runs were stored.
    for branch in range(5):
        made = [r for r in claimed if int(r[4:]) % 5 == branch]
        assert made == sorted(made)


def test_a_replica_name_that_could_leave_its_folder_is_refused(tmp_path: Path) -> None:
    for bad in ("../other", "", ".hidden", "a/b", "x" * 65):
        with pytest.raises(ConfigError, match="harness serve --replica"):
            ServiceSettings(data_dir=tmp_path, token="t" * 32, replica=bad)
    with pytest.raises(ConfigError, match="--report-lease-s"):
        ServiceSettings(data_dir=tmp_path, token="t" * 32, report_lease_s=0.5)
    settings = ServiceSettings(data_dir=tmp_path, token="t" * 32, replica="ci-h100-1.8080")
    assert Layout(tmp_path, settings.replica).tmp_dir == tmp_path / "tmp" / "replicas" / \
        "ci-h100-1.8080"


class _SlowInsert:
    """A store whose inserts wait on an event once the files are placed: the moment a
    second replica's upload of the same run could step in."""

    def __init__(self, store: ResultsStore, placed: threading.Event,
                 release: threading.Event) -> None:
        self._store, self._placed, self._release = store, placed, release

    def __getattr__(self, name: str) -> object:
        return getattr(self._store, name)

    def add_run(self, *args: object, **kwargs: object) -> bool:
        self._placed.set()
        assert self._release.wait(10)
        return self._store.add_run(*args, **kwargs)  # type: ignore[arg-type]


def test_one_run_uploaded_to_two_replicas_at_once_is_placed_once(
        store_url: str, tmp_path: Path) -> None:
    run = make_run("same-run")
    upload = tmp_path / "bundle.tar.gz"
    upload.write_bytes(bundle_bytes(tmp_path, run))
    data = tmp_path / "data"
    placed, release = threading.Event(), threading.Event()
    with open_store(store_url) as first_store, open_store(store_url) as second_store:
        first = Ingestor(Layout(data, "a"), cast(ResultsStore, _SlowInsert(
            first_store, placed, release)), max_unpacked_bytes=10**8, max_members=1000)
        second = Ingestor(Layout(data, "b"), second_store, max_unpacked_bytes=10**8,
                          max_members=1000)
        results: dict[str, Ingested] = {}
        a = threading.Thread(target=lambda: results.update(a=first.ingest(upload)))
        a.start()
        assert placed.wait(10)
        folder = Layout(data).run_dir(run.run_id)
        inode = folder.stat().st_ino
        b = threading.Thread(target=lambda: results.update(b=second.ingest(upload)))
        b.start()
        b.join(1.0)
        # Without the shared lock b saw no row yet and swapped a's files for its own.
        assert b.is_alive(), "the second replica did not wait for the first's upload"
        assert folder.stat().st_ino == inode
        release.set()
        a.join(10)
        b.join(10)
        assert (results["a"].created, results["a"].files_placed) == (True, True)
        assert (results["b"].created, results["b"].files_placed) == (False, False)
        assert folder.stat().st_ino == inode
        assert [r.run_id for r in second_store.list_runs()] == [run.run_id]
