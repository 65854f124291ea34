"""A fleet uploading at once to two service replicas on one PostgreSQL (issue 24).

    .venv/bin/python benchmarks/service_load.py [--runners 50] [--runs-each 10]
        [--replicas 2] [--dashboard-every-s 1]

Starts ``--replicas`` service processes — each the service app ``harness serve`` runs,
under uvicorn, with its own ``--replica`` name — on one throwaway database on the
PostgreSQL server ``$HARNESS_TEST_POSTGRES_URL`` names, sharing one data directory.
Then ``--runners`` runners (threads) each upload ``--runs-each`` runs one after another,
runner ``i`` to replica ``i % replicas``; each run is the main job's record
(``main_job_record.py``: 402 figures, 100 outcomes) with an allure-results folder,
bundled before the clock starts. Meanwhile a reader asks the dashboard index and the
busiest branch page, every ``--dashboard-every-s``, of each replica in turn.

The reports are made by each replica's real worker — claims, leases and all — with a
generator that writes a placeholder page instead of running Allure: the benchmark
measures the service, not Allure (``node`` takes seconds a report on this machine).

Prints the throughput (acknowledged runs a second, first upload to last answer), the
upload latency's p50/p95/p99, the dashboard's latency under the load, then checks that
every upload was acknowledged, each run is stored once, and every report is ready
once the workers are done; exit 1 if not.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import httpx
import main_job_record
from main_job_record import HARDWARE
from sqlalchemy import func, select
from throwaway_postgres import postgres_database

from harness.results.store_backends import create_store_engine, engine_url
from harness.results.store_tables import reports, runs
from harness.service.bundle import make_bundle

TOKEN = "load-benchmark-token"
BRANCHES = ("main", "release-1", "pr-17")
#: Seconds the workers get, after the last upload, to make every report.
REPORTS_DEADLINE_S = 600.0
SERVE = """
import sys
from pathlib import Path

import uvicorn

from harness.service.app import create_app
from harness.service.server import server_config
from harness.service.settings import ServiceSettings


def placeholder(results_dir, output_dir, *, history_path, report_name):
    output_dir.mkdir(parents=True)
    (output_dir / "index.html").write_text("<html>" + report_name + "</html>")
    return []


url, data, replica, port = sys.argv[1:5]
app = create_app(ServiceSettings(data_dir=Path(data), token=sys.argv[5], results_url=url,
                                 replica=replica, report_generator=placeholder))
uvicorn.Server(server_config(app, host="127.0.0.1", port=int(port), lifespan="on",
                             log_level="warning")).run()
"""


def _free_port() -> int:
    import socket  # noqa: PLC0415 - only here

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def replicas(url: str, data: Path, count: int, logs: Path) -> Iterator[list[str]]:
    """``count`` service processes on ``url`` and ``data``; their base URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    bases: list[str] = []
    try:
        for number in range(count):
            port = _free_port()
            log = (logs / f"replica-{number}.log").open("wb")
            procs.append(subprocess.Popen(
                [sys.executable, "-c", SERVE, url, str(data), f"replica-{number}", str(port),
                 TOKEN], stdout=log, stderr=subprocess.STDOUT))
            bases.append(f"http://127.0.0.1:{port}")
        for base, proc in zip(bases, procs, strict=True):
            _wait_healthy(base, proc)
        yield bases
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()


def _wait_healthy(base: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"the replica at {base} exited with {proc.returncode}")
        try:
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"the replica at {base} did not answer /healthz within 60 s")


def bundles(work: Path, runners: int, runs_each: int) -> list[list[tuple[str, bytes]]]:
    """Each runner's runs, as (run id, bundle bytes), made before the clock starts."""
    rng = random.Random(7)
    results = work / "allure-results"
    results.mkdir()
    for number in range(20):  # a main job's results folder, much shortened
        (results / f"{uuid.UUID(int=number)}-result.json").write_text(json.dumps({
            "uuid": str(uuid.UUID(int=number)), "name": f"test_{number}",
            "fullName": f"suites/test_x.py::test_{number}", "status": "passed",
            "start": 0, "stop": 1}))
    found: list[list[tuple[str, bytes]]] = []
    for runner in range(runners):
        mine = []
        for index in range(runs_each):
            minute = runner * runs_each + index
            run = main_job_record.main_job_run(
                f"load-{runner:03d}-{index:03d}", branch=BRANCHES[runner % len(BRANCHES)],
                hardware=HARDWARE[runner % len(HARDWARE)],
                started=f"2026-11-{1 + minute // 1440:02d}T{minute // 60 % 24:02d}:"
                        f"{minute % 60:02d}:00+00:00", rng=rng)
            run_json = work / f"{run.run_id}.json"
            run_json.write_text(json.dumps(run.to_json()))
            bundle = make_bundle(run_json, results, work / f"{run.run_id}.tar.gz")
            mine.append((run.run_id, bundle.read_bytes()))
        found.append(mine)
    return found


def _percentiles(values: list[float]) -> str:
    if len(values) < 2:
        return "too few"
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return (f"p50 {cuts[49] * 1000:.0f} ms, p95 {cuts[94] * 1000:.0f} ms, "
            f"p99 {cuts[98] * 1000:.0f} ms, max {max(values) * 1000:.0f} ms")


class Load:
    """The runners and the dashboard reader, and what they saw."""

    def __init__(self, bases: list[str], planned: list[list[tuple[str, bytes]]],
                 dashboard_every_s: float) -> None:
        self.bases = bases
        self.planned = planned
        self.every_s = dashboard_every_s
        self.acknowledged: dict[str, int] = {}
        self.latencies: list[float] = []
        self.failures: list[str] = []
        self.dashboard: list[float] = []
        self._lock = threading.Lock()
        self._done = threading.Event()

    def run(self) -> float:
        """Every runner to its end, the reader throughout; seconds the uploads took."""
        watcher = threading.Thread(target=self._reader)
        watcher.start()
        threads = [threading.Thread(target=self._runner, args=(n,))
                   for n in range(len(self.planned))]
        started = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        elapsed = time.perf_counter() - started
        self._done.set()
        watcher.join()
        return elapsed

    def _runner(self, number: int) -> None:
        base = self.bases[number % len(self.bases)]
        with httpx.Client(timeout=120) as client:
            for run_id, body in self.planned[number]:
                started = time.perf_counter()
                try:
                    answer = client.post(f"{base}/api/runs", content=body, headers={
                        "Content-Type": "application/gzip", "Authorization": f"Bearer {TOKEN}"})
                except httpx.HTTPError as exc:
                    with self._lock:
                        self.failures.append(f"{run_id}: {exc!r}")
                    continue
                took = time.perf_counter() - started
                with self._lock:
                    if answer.status_code in {200, 201}:
                        self.acknowledged[run_id] = self.acknowledged.get(run_id, 0) + 1
                        self.latencies.append(took)
                    else:
                        self.failures.append(f"{run_id}: {answer.status_code} "
                                             f"{answer.text[:200]}")

    def _reader(self) -> None:
        page = f"/dashboard?branch=main&hardware={HARDWARE[0].identity}"
        turn = 0
        with httpx.Client(timeout=60) as client:
            while not self._done.wait(self.every_s):
                for path in ("/dashboard", page):
                    started = time.perf_counter()
                    answer = client.get(f"{self.bases[turn % len(self.bases)]}{path}")
                    if answer.status_code == 200:
                        self.dashboard.append(time.perf_counter() - started)
                    turn += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runners", type=int, default=50)
    parser.add_argument("--runs-each", type=int, default=10)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--dashboard-every-s", type=float, default=1.0)
    args = parser.parse_args()

    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="service-load-")))
        url = stack.enter_context(postgres_database("service_load", "service_load.py"))
        print(f"bundling {args.runners} x {args.runs_each} runs of the main job", flush=True)
        planned = bundles(work, args.runners, args.runs_each)
        bases = stack.enter_context(replicas(url, work / "data", args.replicas, work))
        print(f"{args.runners} runners uploading to {len(bases)} replicas", flush=True)
        load = Load(bases, planned, args.dashboard_every_s)
        elapsed = load.run()
        total = args.runners * args.runs_each
        print(f"\nuploads: {len(load.acknowledged)} of {total} acknowledged in {elapsed:.1f} s: "
              f"{len(load.acknowledged) / elapsed:.1f} runs/s")
        print(f"upload latency: {_percentiles(load.latencies)}")
        print(f"dashboard under load ({len(load.dashboard)} pages): "
              f"{_percentiles(load.dashboard)}")
        ok = _check(url, planned, load.acknowledged, load.failures)
    return 0 if ok else 1


def _check(url: str, planned: list[list[tuple[str, bytes]]], acknowledged: dict[str, int],
           failures: list[str]) -> bool:
    """Nothing lost or duplicated, and every report ready once the workers are done."""
    wanted = {run_id for mine in planned for run_id, _ in mine}
    engine = create_store_engine(engine_url(url))
    deadline = time.monotonic() + REPORTS_DEADLINE_S
    try:
        with engine.connect() as conn:
            stored = [str(r) for r in conn.execute(select(runs.c.run_id)).scalars()]
        while True:
            with engine.connect() as conn:
                states: dict[str, int] = dict(conn.execute(
                    select(reports.c.state, func.count()).group_by(reports.c.state)).all())
            if not states.get("pending") or time.monotonic() > deadline:
                break
            time.sleep(0.5)
    finally:
        engine.dispose()
    checks = {
        "every upload acknowledged": set(acknowledged) == wanted and not failures,
        "each run stored once": sorted(stored) == sorted(wanted),
        "every report ready": states == {"ready": len(wanted)},
    }
    for name, passed in checks.items():
        print(f"{'PASS' if passed else 'FAIL'}: {name}")
    if failures:
        print("failed uploads:\n  " + "\n  ".join(failures[:20]))
    if states != {"ready": len(wanted)}:
        print(f"report states: {states}")
    return all(checks.values())


if __name__ == "__main__":
    sys.exit(main())
