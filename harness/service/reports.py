"""Allure reports for stored runs, made one at a time by a background worker.

One thread with a queue: Allure appends each report's entry to the history file of
the run's branch + hardware, so reports must be made one after another, in the order
the runs arrived, or trends would interleave.

A run's report state (pending, ready, failed) is a row in the results store, and a new
run's "pending" row is committed in the same transaction as the run (ingest.py): a run
the service acknowledged has its report queued even if the process dies the next
instant. When the worker starts it queues again every run still pending, and every
stored run that has files in this data directory but no state at all (stored by
`harness store`, or by a service from before the state moved into the store), oldest
first. A failed report is recorded as failed and never fails the upload that queued it.

A report is made in a folder of its own under ``tmp/`` (emptied at start) and renamed
into ``runs/<id>/report/`` whole; the Allure CLI runs in its own process group and dies
with the worker (harness.report.allure), so a ``kill -9`` of the service leaves neither
a half-made report nor a ``node`` process behind.
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
from typing import Any, Protocol

from harness.data_schema import load_json, schema_file
from harness.errors import HarnessError
from harness.results.run_record import RunRecord
from harness.results.store import ResultsStore
from harness.results.store_rows import ReportState
from harness.service.layout import Layout, is_valid_run_id

log = logging.getLogger(__name__)

PENDING_MESSAGE = "report is being made"
#: How many run ids one "skipped" log line names.
_LOGGED_IDS = 10
#: What an older service's ``report-state.json`` holds (imported once at start).
_LEGACY_STATE_SCHEMA = schema_file("report-state")


class ReportGenerator(Protocol):
    """Writes the Allure report for ``results_dir`` into ``output_dir``.

    ``output_dir`` does not exist yet, and its parent is a folder of the worker's own
    inside the data directory, free for the generator's temporary files. Returns the
    problems worth showing (warnings of a report that was still made); raises to say
    that no report could be made.
    """

    def __call__(self, results_dir: Path, output_dir: Path, *, history_path: Path,
                 report_name: str) -> Sequence[str]: ...


def allure_generator(results_dir: Path, output_dir: Path, *, history_path: Path,
                     report_name: str) -> Sequence[str]:
    """The default generator: the Allure 3 CLI that ``allure_command()`` finds."""
    # Imported here so the service starts (and reports the failure per run) even where
    # the report module or node is missing.
    from harness.report.allure import generate_report  # noqa: PLC0415

    # Temporary files beside the output: inside the data dir, swept at start, never
    # in the system temp where a killed service would leave them for good.
    result = generate_report(results_dir, output_dir, history_path=history_path,
                             report_name=report_name, temp_root=output_dir.parent)
    return [str(problem) for problem in result.problems]


def pending_state() -> ReportState:
    """The state a run gets when its report is queued, stamped now."""
    return ReportState("pending", message=PENDING_MESSAGE, queued_ns=time.time_ns(),
                       updated_at=_now())


@dataclass(frozen=True)
class ReportJob:
    run_id: str
    report_name: str
    history_path: Path
    #: When the report was queued (``time.time_ns()``), kept in the finished state.
    queued_ns: int = 0

    @classmethod
    def for_run(cls, layout: Layout, run: RunRecord, *, queued_ns: int = 0) -> ReportJob:
        return cls(run_id=run.run_id,
                   report_name=f"{run.branch} {run.run_id} ({run.hardware.describe()})",
                   history_path=layout.history_file(run.branch, run.hardware.identity),
                   queued_ns=queued_ns)


def report_url(run_id: str) -> str:
    return f"/runs/{run_id}/report/"


def read_states(store: ResultsStore, run_ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The report state of each run for the API (state, message, problems, url); one query."""
    found = store.report_states(run_ids)
    return {run_id: _answer(run_id, found.get(run_id)) for run_id in run_ids}


def read_state(store: ResultsStore, run_id: str) -> dict[str, Any]:
    """The run's report state for the API: state, message, problems, url."""
    return read_states(store, [run_id])[run_id]


def _answer(run_id: str, state: ReportState | None) -> dict[str, Any]:
    if state is None:
        return {"state": "none", "message": "no report was queued for this run",
                "problems": [], "url": None}
    return {"state": state.state, "message": state.message, "problems": list(state.problems),
            "url": report_url(run_id) if state.state == "ready" else None}


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class ReportWorker:
    """The queue and the one thread that drains it."""

    def __init__(self, layout: Layout, store: ResultsStore, generate: ReportGenerator) -> None:
        self._layout = layout
        self._store = store
        self._generate = generate
        self._queue: queue.Queue[ReportJob | None] = queue.Queue()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Queue the reports a previous process left unmade, then start the thread.

        Blocking (store queries); raises ResultsStoreError when the store cannot say.
        """
        for job in self._unmade_jobs():
            self._queue.put(job)
        # The thread lives as long as the service: the Allure CLI it starts is tied to
        # it (PR_SET_PDEATHSIG fires when the forking thread ends).
        self._thread = threading.Thread(target=self._loop, name="allure-reports",
                                        daemon=True)
        self._thread.start()

    def submit(self, job: ReportJob) -> None:
        """Queue ``job``; the run's "pending" state must already be in the store."""
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

    # -- what a previous process left -------------------------------------------

    def _unmade_jobs(self) -> list[ReportJob]:
        self._import_legacy_states()
        jobs = self._pending_jobs() + self._stateless_jobs()
        if jobs:
            log.info("requeued %d report(s) a previous process left unmade", len(jobs))
        return jobs

    def _pending_jobs(self) -> list[ReportJob]:
        awaiting = self._store.runs_awaiting_report()
        queued = self._store.report_states(awaiting)
        jobs: list[ReportJob] = []
        for run_id in awaiting:
            if not self._has_files(run_id):
                # Left pending: an upload of the run brings the files and queues it again.
                log.warning("report of run %s stays pending: its files are not in %s; "
                            "upload the run again to make it", run_id, self._layout.runs_dir)
                continue
            job = self._job(run_id, queued[run_id].queued_ns if run_id in queued else 0)
            if job is not None:
                jobs.append(job)
        return jobs

    def _stateless_jobs(self) -> list[ReportJob]:
        """Jobs for the runs with no report state at all, where their files are here.

        Such a run was stored by `harness store`, or by an older service that died
        between committing the run and writing its state file.
        """
        jobs: list[ReportJob] = []
        skipped: list[str] = []
        for run_id in self._store.runs_without_report():
            if not self._has_files(run_id):
                skipped.append(run_id)
                continue
            state = pending_state()
            job = self._job(run_id, state.queued_ns)
            if job is not None:
                self._store.set_report_state(run_id, state)
                jobs.append(job)
        if skipped:
            more = f" and {len(skipped) - _LOGGED_IDS} more" if len(skipped) > _LOGGED_IDS else ""
            log.info("no report for %d stored run(s) whose files are not in %s (upload them "
                     "to make one): %s%s", len(skipped), self._layout.runs_dir,
                     ", ".join(skipped[:_LOGGED_IDS]), more)
        return jobs

    def _job(self, run_id: str, queued_ns: int) -> ReportJob | None:
        run = self._store.get_run(run_id)
        return None if run is None else ReportJob.for_run(self._layout, run,
                                                          queued_ns=queued_ns)

    def _has_files(self, run_id: str) -> bool:
        return is_valid_run_id(run_id) and self._layout.results_dir(run_id).is_dir()

    def _import_legacy_states(self) -> None:
        """Move each ``report-state.json`` of an older service into the store, once."""
        runs_dir = self._layout.runs_dir
        files = {path.parent.name: path
                 for path in (runs_dir.glob("*/report-state.json") if runs_dir.is_dir() else ())
                 if is_valid_run_id(path.parent.name)}
        if not files:
            return
        # Only runs stored without a state: a row already there is newer than the file,
        # and a folder without a run is an upload that died before its row.
        stateless = set(self._store.runs_without_report())
        for run_id, path in sorted(files.items()):
            if run_id in stateless:
                state = _legacy_state(path)
                if state is not None:
                    self._store.set_report_state(run_id, state)
            elif self._store.get_run(run_id) is None:
                continue
            path.unlink(missing_ok=True)

    # -- the thread -------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None or self._stopping.is_set():
                    return
                self._make(job)
            # Even the store failing to record a state must not end the worker; the
            # run then stays pending and is made again at the next start.
            except Exception:
                log.exception("report worker: job %s", job)
            finally:
                self._queue.task_done()

    def _make(self, job: ReportJob) -> None:
        layout = self._layout
        final = layout.report_dir(job.run_id)
        # Made in a folder of its own under tmp/ (emptied at start, same filesystem)
        # and renamed in, so the report is served whole and a kill leaves nothing in
        # runs/.
        work = layout.tmp_dir / f"report-{uuid.uuid4().hex}"
        partial = work / "report"
        try:
            work.mkdir(parents=True)
            job.history_path.parent.mkdir(parents=True, exist_ok=True)
            problems = self._generate(layout.results_dir(job.run_id), partial,
                                      history_path=job.history_path,
                                      report_name=job.report_name)
            if not (partial / "index.html").is_file():
                raise HarnessError(f"the report generator wrote no index.html into {partial}")
            if final.exists():
                os.rename(final, work / "previous")
            os.rename(partial, final)
        # Any failure at all is this run's report failing, never the worker dying.
        except Exception as exc:
            log.warning("report of run %s failed: %s", job.run_id, exc)
            self._store.set_report_state(job.run_id, ReportState(
                "failed", message=f"{type(exc).__name__}: {exc}", queued_ns=job.queued_ns,
                updated_at=_now()))
            return
        finally:
            shutil.rmtree(work, ignore_errors=True)
        self._store.set_report_state(job.run_id, ReportState(
            "ready", problems=tuple(problems), queued_ns=job.queued_ns, updated_at=_now()))


def _legacy_state(path: Path) -> ReportState | None:
    """The state in an older service's file; None (made again) when it is unreadable."""
    try:
        body = load_json(path, _LEGACY_STATE_SCHEMA, HarnessError)
        return ReportState(body["state"], message=body.get("message"),
                           problems=tuple(body.get("problems", ())),
                           queued_ns=int(body.get("queued_ns", 0)),
                           updated_at=body["updated_at"] if "updated_at" in body else _now())
    # ValueError: ReportState refuses what the file holds (kept should the two part ways).
    except (HarnessError, ValueError) as exc:
        log.warning("%s; the run's report is made again", exc)
        return None
