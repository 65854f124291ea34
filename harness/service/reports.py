"""Allure reports for stored runs, made one at a time by a background worker.

One thread with a queue: Allure appends each report's entry to the history file of
the run's branch + hardware, so reports must be made one after another, in the order
the runs arrived, or trends would interleave. A failed report is recorded in the
run's ``report-state.json`` and never fails the upload that queued it. Jobs still
pending when the service stops are picked up again when it next starts.
"""

from __future__ import annotations

import logging
import os
import queue
import shutil
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from harness.errors import HarnessError
from harness.files import write_json_atomic
from harness.results.model import RunRecord
from harness.service.bundle import RUN_JSON
from harness.service.layout import Layout, is_valid_run_id
from harness.strictjson import read_object

log = logging.getLogger(__name__)

State = Literal["pending", "ready", "failed"]


class ReportGenerator(Protocol):
    """Writes the Allure report for ``results_dir`` into ``output_dir``.

    Returns the problems worth showing (warnings of a report that was still made);
    raises to say that no report could be made.
    """

    def __call__(self, results_dir: Path, output_dir: Path, *, history_path: Path,
                 report_name: str) -> Sequence[str]: ...


def allure_generator(results_dir: Path, output_dir: Path, *, history_path: Path,
                     report_name: str) -> Sequence[str]:
    """The default generator: the Allure 3 CLI from the repository's node_modules."""
    # Imported here so the service starts (and reports the failure per run) even where
    # the report module or node is missing.
    from harness.report.allure import generate_report  # noqa: PLC0415

    result = generate_report(results_dir, output_dir, history_path=history_path,
                             report_name=report_name)
    return [str(problem) for problem in result.problems]


@dataclass(frozen=True)
class ReportJob:
    run_id: str
    report_name: str
    history_path: Path

    @classmethod
    def for_run(cls, layout: Layout, run: RunRecord) -> ReportJob:
        return cls(run_id=run.run_id,
                   report_name=f"{run.branch} {run.run_id} ({run.hardware.describe()})",
                   history_path=layout.history_file(run.branch, run.hardware.identity))


def report_url(run_id: str) -> str:
    return f"/runs/{run_id}/report/"


def read_state(layout: Layout, run_id: str) -> dict[str, Any]:
    """The run's report state for the API: state, message, problems, url."""
    path = layout.report_state_file(run_id)
    if not path.is_file():
        return {"state": "none", "message": "no report was queued for this run",
                "url": None}
    try:
        body = read_object(path, HarnessError)
    except HarnessError as exc:
        return {"state": "failed", "message": str(exc), "url": None}
    state = body.get("state")
    return {"state": state, "message": body.get("message"),
            "problems": body.get("problems", []),
            "url": report_url(run_id) if state == "ready" else None}


def _write_state(layout: Layout, run_id: str, state: State, *, message: str | None = None,
                 problems: Sequence[str] = (), queued_ns: int | None = None) -> None:
    path = layout.report_state_file(run_id)
    previous = read_object(path, HarnessError) if path.is_file() else {}
    write_json_atomic(path, {
        "state": state, "message": message, "problems": list(problems),
        "queued_ns": queued_ns if queued_ns is not None else previous.get("queued_ns", 0),
        "updated_at": datetime.now(UTC).isoformat(timespec="seconds"),
    })


class ReportWorker:
    """The queue and the one thread that drains it."""

    def __init__(self, layout: Layout, generate: ReportGenerator) -> None:
        self._layout = layout
        self._generate = generate
        self._queue: queue.Queue[ReportJob | None] = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        for job in self._pending_jobs():
            self._queue.put(job)
        self._thread = threading.Thread(target=self._loop, name="allure-reports",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: ReportJob) -> None:
        _write_state(self._layout, job.run_id, "pending", message="report is being made",
                     queued_ns=time.time_ns())
        self._queue.put(job)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the report in progress (up to ``timeout_s``); the rest stay pending."""
        self._stopping.set()
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """True once every queued report is made (tests and orderly shutdowns)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._queue.unfinished_tasks == 0:
                return True
            time.sleep(0.05)
        return False

    def _pending_jobs(self) -> list[ReportJob]:
        found: list[tuple[int, ReportJob]] = []
        runs_dir = self._layout.runs_dir
        for state_file in runs_dir.glob("*/report-state.json") if runs_dir.is_dir() else ():
            run_id = state_file.parent.name
            if not is_valid_run_id(run_id):
                continue
            try:
                state = read_object(state_file, HarnessError)
                if state.get("state") != "pending":
                    continue
                run = RunRecord.from_json(read_object(state_file.parent / RUN_JSON,
                                                      HarnessError))
            except (HarnessError, KeyError, TypeError, ValueError) as exc:
                log.warning("cannot requeue the report of %s: %s", run_id, exc)
                continue
            found.append((int(state.get("queued_ns", 0)), ReportJob.for_run(self._layout, run)))
        return [job for _, job in sorted(found, key=lambda item: item[0])]

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None or self._stopping.is_set():
                    return
                self._make(job)
            # Even the state file failing to write must not end the worker.
            except Exception:
                log.exception("report worker: job %s", job)
            finally:
                self._queue.task_done()

    def _make(self, job: ReportJob) -> None:
        layout = self._layout
        final = layout.report_dir(job.run_id)
        # Made beside the final place and renamed in, so the report is served whole.
        partial = final.with_name(f".report.{uuid.uuid4().hex}.partial")
        try:
            job.history_path.parent.mkdir(parents=True, exist_ok=True)
            problems = self._generate(layout.results_dir(job.run_id), partial,
                                      history_path=job.history_path,
                                      report_name=job.report_name)
            if not (partial / "index.html").is_file():
                raise HarnessError(f"the report generator wrote no index.html into {partial}")
            if final.exists():
                shutil.rmtree(final)
            os.rename(partial, final)
        # Any failure at all is this run's report failing, never the worker dying.
        except Exception as exc:
            log.warning("report of run %s failed: %s", job.run_id, exc)
            shutil.rmtree(partial, ignore_errors=True)
            _write_state(layout, job.run_id, "failed",
                         message=f"{type(exc).__name__}: {exc}")
            return
        _write_state(layout, job.run_id, "ready", problems=problems)
