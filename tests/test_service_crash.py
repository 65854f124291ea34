"""Crash safety of the results service: ``kill -9`` a real ``harness serve``, start it again.

Each service test runs a ``harness serve`` child on one data directory and store (SQLite
and PostgreSQL, see results_fixtures), kills it with SIGKILL at a chosen moment, and
starts a new one on the same data: every run the service acknowledged must be stored
and get its report, and nothing the killed process was making may be left behind — no
``node`` process, no partial report folder, no temporary folder outside the data dir.
Reports are made by the real Allure CLI (under a second each for these results).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import service_helpers
from checkout import allure_missing
from results_fixtures import (  # noqa: F401 - store_url is a fixture
    at,
    make_run,
    outcome,
    store_url,
)
from test_service import AUTH, GZIP, TOKEN, bundle_bytes, write_allure_results

from harness.report.allure import ReportError, _run_allure
from harness.results.run_record import RunRecord
from harness.results.store import open_store
from harness.service.bundle import make_bundle
from harness.service.layout import DEFAULT_REPLICA, Layout
from harness.service.reports import DEFAULT_LEASE_S, pending_state

#: Reports are made one at a time; a few runs of a few tests each take seconds, but CI
#: machines are shared.
REPORT_DEADLINE_S = 240.0
#: PR_SET_PDEATHSIG is delivered as the parent dies; the rest is the kernel reaping.
CHILD_GONE_S = 5.0
#: Enough results that Allure runs for a second or more, so the test can catch it.
BIG_RESULTS = 3000
#: Names a killed report leaves: the worker's partial folders, Allure's ``.new-`` and
#: ``.old-`` swaps, and the CLI's temporary folder.
_LEFTOVER = re.compile(r"(\.\.?report\..*|.*\.(new|old)-[0-9a-f]+|harness-report-.*|.*partial.*)")

needs_allure = pytest.mark.skipif(allure_missing() is not None,
                                  reason=f"no Allure 3 CLI: {allure_missing()}")


@dataclass
class Serve:
    """``harness serve`` as a child process, started again on the same data at will."""

    data_dir: Path
    store_url: str
    log_path: Path
    port: int = field(default_factory=service_helpers.free_port)
    proc: subprocess.Popen[bytes] | None = None
    #: As Layout's default, so a test's Layout(data_dir) sees this replica's folders.
    replica: str = DEFAULT_REPLICA
    report_lease_s: float = DEFAULT_LEASE_S

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [str(Path(sys.executable).with_name("harness")), "serve", "--host",
                "127.0.0.1", "--port", str(self.port), "--data-dir", str(self.data_dir),
                "--results-url", self.store_url, "--replica", self.replica,
                "--report-lease-s", str(self.report_lease_s)]
        env = {**os.environ, "HARNESS_SERVICE_TOKEN": TOKEN}
        with self.log_path.open("a") as log:
            log.write(f"--- start {time.strftime('%H:%M:%S')} ---\n")
            log.flush()
            self.proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        service_helpers.wait_healthy(self.url, self.proc, self.log_path)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
            self.proc = None

    def upload(self, body: bytes) -> httpx.Response:
        return httpx.post(f"{self.url}/api/runs", content=body, headers={**GZIP, **AUTH},
                          timeout=120)

    def reports(self) -> dict[str, dict[str, Any]]:
        answer = httpx.get(f"{self.url}/api/runs", params={"limit": "1000"}, timeout=30)
        assert answer.status_code == 200, answer.text
        return {run["run_id"]: run["report"] for run in answer.json()["runs"]}

    def wait_reports(self) -> dict[str, dict[str, Any]]:
        """Every stored run's report state, once none is pending any more."""
        deadline = time.monotonic() + REPORT_DEADLINE_S
        while True:
            reports = self.reports()
            pending = sorted(run_id for run_id, report in reports.items()
                             if report["state"] == "pending")
            if not pending:
                return reports
            assert time.monotonic() < deadline, f"reports still pending: {pending}\n" \
                f"{self.log_path.read_text()[-4000:]}"
            time.sleep(0.3)


@pytest.fixture
def serve(tmp_path: Path, store_url: str) -> Iterator[Serve]:  # noqa: F811
    service = Serve(tmp_path / "data", store_url, tmp_path / "serve.log")
    try:
        yield service
    finally:
        service.stop()


def _leftovers(data_dir: Path) -> list[Path]:
    """What a killed report may leave anywhere under the data dir (none of it should)."""
    return sorted(path for path in data_dir.rglob("*") if _LEFTOVER.fullmatch(path.name))


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _processes_naming(path: Path) -> list[str]:
    """Live processes whose command line or working directory is under ``path``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd", "status"]):
        info = proc.info
        if info["status"] == psutil.STATUS_ZOMBIE:
            continue
        words = [*(info["cmdline"] or []), info["cwd"] or ""]
        if any(str(path) in word for word in words):
            found.append(f"{info['pid']}: {' '.join(info['cmdline'] or [])}")
    return found


def _report_child(server: subprocess.Popen[bytes], timeout_s: float) -> psutil.Process:
    """The Allure CLI (node) among the service's descendants, once it runs."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            for child in psutil.Process(server.pid).children(recursive=True):
                if any("allure" in word for word in child.cmdline()):
                    return child
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            pass
        assert server.poll() is None, "harness serve exited while its report was made"
        time.sleep(0.01)
    raise AssertionError(f"no Allure process appeared under harness serve in {timeout_s}s")


def _big_bundle(tmp_path: Path, run: RunRecord, tests: int) -> bytes:
    work = tmp_path / f"bundle-{run.run_id}"
    work.mkdir()
    (work / "run.json").write_text(json.dumps(run.to_json()))
    results = write_allure_results(work / "allure-results",
                                   [(f"test_{i}", "passed") for i in range(tests)])
    return make_bundle(work / "run.json", results, work / "bundle.tar.gz").read_bytes()


def _place_files(layout: Layout, run: RunRecord) -> None:
    """What ingest puts in runs/<id>/ before it commits the run."""
    run_dir = layout.run_dir(run.run_id)
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps(run.to_json()))
    write_allure_results(layout.results_dir(run.run_id), [("test_a", "passed")])


@needs_allure
@pytest.mark.timeout(600)
def test_kill_during_an_upload_burst_loses_no_acknowledged_run(serve: Serve,
                                                               tmp_path: Path) -> None:
    runs = [make_run(f"burst-{i}", started_at=at(i),
                     outcomes=[outcome("t.py::test_a"), outcome("t.py::test_b", "failed")])
            for i in range(6)]
    bodies = {run.run_id: bundle_bytes(tmp_path, run) for run in runs}
    serve.start()
    acknowledged: list[str] = []
    first = threading.Event()

    def send(run_id: str) -> None:
        try:
            answer = serve.upload(bodies[run_id])
        except httpx.TransportError:
            return  # the kill cut it off: the service never said it had the run
        if answer.status_code in {200, 201}:
            acknowledged.append(run_id)
            first.set()

    with ThreadPoolExecutor(len(runs)) as pool:
        for run_id in bodies:
            pool.submit(send, run_id)
        assert first.wait(120), "no upload was acknowledged"
        serve.kill9()
    assert acknowledged

    serve.start()
    reports = serve.wait_reports()
    with open_store(serve.store_url) as store:
        stored = {run.run_id for run in store.list_runs()}
    assert set(acknowledged) <= stored
    # Acknowledged or not, a run that is stored gets its report.
    assert {run_id: reports[run_id]["state"] for run_id in stored} == dict.fromkeys(
        stored, "ready")
    for run_id in stored:
        assert httpx.get(f"{serve.url}/runs/{run_id}/report/", timeout=30).status_code == 200
    assert _leftovers(serve.data_dir) == []


@needs_allure
@pytest.mark.timeout(600)
def test_kill_while_a_report_is_made_leaves_nothing_behind(serve: Serve,
                                                          tmp_path: Path) -> None:
    system_temp = Path(tempfile.gettempdir())
    temp_before = set(system_temp.glob("harness-report-*"))
    body = _big_bundle(tmp_path, make_run("big"), BIG_RESULTS)
    serve.start()
    assert serve.proc is not None
    assert serve.upload(body).status_code == 201
    node = _report_child(serve.proc, REPORT_DEADLINE_S)
    command = node.cmdline()
    config = Path(command[command.index("--config") + 1])
    # The CLI's staged results and config live in the data dir, swept at start.
    assert config.is_relative_to(serve.data_dir / "tmp"), command
    assert _leftovers(serve.data_dir), "the report in progress has no folder of its own"

    # Stopped, Allure cannot finish on its own before the check; only SIGKILL, which
    # reaches a stopped process, ends it.
    node.suspend()
    try:
        serve.kill9()
        assert _wait_gone(node.pid, CHILD_GONE_S), f"Allure outlived harness serve: {command}"
    finally:
        if _alive(node.pid):
            node.kill()
    assert _processes_naming(serve.data_dir) == []

    serve.start()
    reports = serve.wait_reports()
    assert reports["big"]["state"] == "ready", reports["big"]
    assert httpx.get(f"{serve.url}/runs/big/report/", timeout=30).status_code == 200
    assert _leftovers(serve.data_dir) == []
    assert service_helpers.tmp_leftovers(serve.data_dir) == []
    new_temp = set(system_temp.glob("harness-report-*")) - temp_before
    ours = [path for path in new_temp
            if str(serve.data_dir) in _read(path / "allurerc.json")]
    assert ours == []


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


@needs_allure
@pytest.mark.timeout(600)
def test_runs_committed_just_before_a_kill_get_their_reports(serve: Serve) -> None:
    layout = Layout(serve.data_dir)
    layout.create()
    committed = make_run("committed", started_at=at(1))
    stateless = make_run("stateless", started_at=at(2))
    legacy_pending = make_run("legacy-pending", started_at=at(3))
    legacy_ready = make_run("legacy-ready", started_at=at(4))
    elsewhere = make_run("stored-elsewhere", started_at=at(5))
    with open_store(serve.store_url) as store:
        # Ingest killed right after its commit: files, run and pending state, no job.
        _place_files(layout, committed)
        store.add_run(committed, report=pending_state())
        # An older service killed between its commit and its state file.
        _place_files(layout, stateless)
        store.add_run(stateless)
        # Older services' state files: pending is made, ready is kept as it is.
        for run, state in ((legacy_pending, "pending"), (legacy_ready, "ready")):
            _place_files(layout, run)
            store.add_run(run)
            layout.legacy_report_state_file(run.run_id).write_text(json.dumps(
                {"state": state, "message": None, "problems": ["kept"], "queued_ns": 7}))
        old_report = layout.report_dir(legacy_ready.run_id) / "index.html"
        old_report.parent.mkdir()
        old_report.write_text("<html>made before</html>")
        # Stored by `harness store`: its files are not in this data dir.
        store.add_run(elsewhere)
    # What a killed older service left while making reports.
    (layout.run_dir("committed") / ".report.0123abcd.partial" / "data").mkdir(parents=True)
    (layout.run_dir("committed") / "..report.0123abcd.partial.new-89ab0123").mkdir()
    (layout.tmp_dir / "harness-report-x1y2" / "allure-results").mkdir(parents=True)

    serve.start()
    reports = serve.wait_reports()
    states = {run_id: report["state"] for run_id, report in reports.items()}
    assert states == {"committed": "ready", "stateless": "ready", "legacy-pending": "ready",
                      "legacy-ready": "ready", "stored-elsewhere": "none"}
    assert reports["legacy-ready"]["problems"] == ["kept"]
    assert old_report.read_text() == "<html>made before</html>"
    for run_id in ("committed", "stateless", "legacy-pending"):
        index = layout.report_dir(run_id) / "index.html"
        assert "<html" in index.read_text().lower()
    assert list(layout.runs_dir.glob("*/report-state.json")) == []
    assert _leftovers(serve.data_dir) == []
    assert "stored-elsewhere" in serve.log_path.read_text()


def test_the_report_cli_dies_with_the_process_that_started_it(tmp_path: Path) -> None:
    pid_file = tmp_path / "child.pid"
    script = ("import sys; from harness.report.allure import _run_allure; "
              "_run_allure(['sh', '-c', 'echo $$ > \"$0\"; exec sleep 120', sys.argv[1]], 300)")
    parent = subprocess.Popen([sys.executable, "-c", script, str(pid_file)])
    try:
        deadline = time.monotonic() + 30
        while not pid_file.is_file() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the child never started"
            time.sleep(0.02)
        child = int(pid_file.read_text())
        assert _alive(child)
        assert os.getpgid(child) == child, "the child leads no process group of its own"
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        assert _wait_gone(child, CHILD_GONE_S), "the child outlived the process that started it"
    finally:
        parent.kill()
        parent.wait(30)


def test_a_timed_out_report_cli_is_killed_with_its_children(tmp_path: Path) -> None:
    pid_file = tmp_path / "grandchild.pid"
    started = time.monotonic()
    with pytest.raises(ReportError, match="did not finish within"):
        _run_allure(["sh", "-c", 'sleep 120 & echo $! > "$0"; wait', str(pid_file)], 1.0)
    assert time.monotonic() - started < 30
    assert _wait_gone(int(pid_file.read_text()), CHILD_GONE_S), \
        "a process the CLI started outlived its timeout"
