"""Two real `harness serve` replicas on one PostgreSQL and one data directory, and a
``kill -9`` of one in the middle of a burst of uploads and of making a report.

Uploads go to either replica; a client whose replica dies sends the run to the other
one, as a fleet's uploader with two endpoints does. Afterwards every run is stored
once, every report is ready and was made once (the one the killed replica held is
taken over when its lease ends), and nothing of either replica's work is left behind.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from results_fixtures import at, make_run, outcome, postgres_url  # noqa: F401 - a fixture
from service_helpers import tmp_leftovers
from sqlalchemy import select
from test_service_crash import (
    Serve,
    _big_bundle,
    _leftovers,
    _processes_naming,
    _report_child,
    needs_allure,
)

from harness.results.store import open_store
from harness.results.store_backends import create_store_engine, engine_url
from harness.results.store_tables import reports

#: Short, so the test sees the takeover within seconds; each replica renews every third.
LEASE_S = 6.0
RUNS = 10
#: Tests per run: enough that Allure takes a moment, so a replica is caught making one.
TESTS_PER_RUN = 800


def _held_by(url: str, replica: str) -> list[str]:
    """Run ids whose report job ``replica`` holds a claim on."""
    engine = create_store_engine(engine_url(url))
    try:
        with engine.connect() as conn:
            return [str(r) for r in conn.execute(
                select(reports.c.run_id).where(reports.c.claimed_by == replica,
                                               reports.c.state == "pending")).scalars()]
    finally:
        engine.dispose()


def _history_entries(data_dir: Path) -> Counter[str]:
    """How many reports of each run appended to the Allure history (one per report made
    to the end); a history entry's name is the report's, which carries the run id."""
    made: Counter[str] = Counter()
    for history in (data_dir / "history").rglob("*.jsonl"):
        for line in history.read_text().splitlines():
            name = str(json.loads(line).get("name", ""))
            made.update(word for word in name.split() if word.startswith("burst-"))
    return made


@needs_allure
@pytest.mark.timeout(900)
def test_two_replicas_survive_a_kill_of_one_during_an_upload_burst(
        postgres_url: str, tmp_path: Path) -> None:  # noqa: F811
    data = tmp_path / "data"
    first = Serve(data, postgres_url, tmp_path / "replica-a.log", replica="replica-a",
                  report_lease_s=LEASE_S)
    second = Serve(data, postgres_url, tmp_path / "replica-b.log", replica="replica-b",
                   report_lease_s=LEASE_S)
    runs = [make_run(f"burst-{i:02d}", branch=f"branch-{i % 3}", started_at=at(i),
                     outcomes=[outcome("t.py::test_a")]) for i in range(RUNS)]
    bodies = {run.run_id: _big_bundle(tmp_path, run, TESTS_PER_RUN) for run in runs}
    answered: dict[str, list[int]] = {}
    lock = threading.Lock()

    def send(run_id: str, to: Serve, fallback: Serve) -> None:
        for replica in (to, fallback):
            try:
                answer = replica.upload(bodies[run_id])
            except httpx.TransportError:
                continue  # that replica died under the request: the other one gets it
            with lock:
                answered.setdefault(run_id, []).append(answer.status_code)
            if answer.status_code in {200, 201}:
                return

    try:
        first.start()
        second.start()
        with ThreadPoolExecutor(4) as pool:
            for number, run_id in enumerate(bodies):
                to, fallback = (first, second) if number % 2 == 0 else (second, first)
                pool.submit(send, run_id, to, fallback)
            assert first.proc is not None
            # Killed while it makes a report, with uploads still arriving.
            _report_child(first.proc, timeout_s=240)
            first.kill9()
            # Read before its lease ends and the other replica takes the job.
            taken_over = _held_by(postgres_url, "replica-a")
        # Its Allure was running: it held the claim on that report when it died.
        assert len(taken_over) == 1, taken_over

        # Every upload was acknowledged, by one replica or the other.
        assert sorted(answered) == sorted(bodies), answered
        assert all(codes[-1] in {200, 201} for codes in answered.values()), answered
        states = second.wait_reports()
        with open_store(postgres_url) as store:
            stored = [run.run_id for run in store.list_runs(limit=1000)]
        assert sorted(stored) == sorted(bodies)  # each run once
        assert {run_id: states[run_id]["state"] for run_id in stored} == dict.fromkeys(
            stored, "ready"), {run_id: states[run_id] for run_id in stored}
        for run_id in stored:
            report = httpx.get(f"{second.url}/runs/{run_id}/report/", timeout=30)
            assert report.status_code == 200, run_id
        made = _history_entries(data)
        # Made once each. The report the killed replica held was taken over; its own
        # try died with it, and counts only if Allure had finished appending the
        # history before the kill.
        assert {run_id: made[run_id] for run_id in stored if run_id not in taken_over} \
            == {run_id: 1 for run_id in stored if run_id not in taken_over}, made
        assert all(made[run_id] in {1, 2} for run_id in taken_over), (taken_over, made)
        assert [found for found in _processes_naming(data) if " serve " not in found] == [], \
            "a killed replica's Allure is still running"

        # What is left is the killed replica's own partial work, which the other replica
        # did not touch and its own restart sweeps.
        first_tmp = data / "tmp" / "replicas" / "replica-a"
        assert [path for path in [*_leftovers(data), *tmp_leftovers(data)]
                if path != first_tmp and first_tmp not in path.parents] == []
        assert list((data / "tmp" / "replicas" / "replica-b").iterdir()) == []
        first.start()
        assert _leftovers(data) == []
        assert tmp_leftovers(data) == []
    finally:
        first.stop()
        second.stop()
