"""Allure reports for stored runs, made by every service replica from one job queue.

The queue is the store: a run's report state (pending, ready, failed) is a row there,
and a new run's "pending" row is committed in the same transaction as the run
(ingest.py), so a run any replica acknowledged has its report queued even if that
replica dies the next instant. Each replica's worker thread claims jobs with a lease
(harness/results/report_claims.py: ``FOR UPDATE SKIP LOCKED`` on PostgreSQL), renews it
while Allure runs, and records the outcome only while the claim is still its own; a
dead replica's jobs are taken over by another when their leases end. Allure appends
each report's entry to the history file of the run's branch + hardware, so the claim
rule makes those reports one at a time, in the order the runs were stored, across
every replica. At start a replica gives up its own earlier claims and queues the
stored runs that have files in the data directory but no state at all (stored by
`harness store`, or by a service from before the state moved into the store). A
pending run whose files are missing fails with the fix ("upload the run again"), and a
failed report never fails the upload that queued it.

A report is made in a folder of its own under the replica's ``tmp/`` (emptied at its
start) and renamed into ``runs/<id>/report/`` whole; the Allure CLI runs in its own
process group and dies with the worker (harness.report.allure), so a ``kill -9`` of a
replica leaves neither a half-made report nor a ``node`` process behind.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from harness.data_schema import load_json, schema_file
from harness.errors import HarnessError
from harness.results.run_record import RunRecord
from harness.results.store import ResultsStore
from harness.results.store_rows import ReportState
from harness.service.layout import DEFAULT_REPLICA, Layout, is_valid_run_id

log = logging.getLogger(__name__)

PENDING_MESSAGE = "report is being made"
#: Seconds a claim on a report job holds without renewal: a replica renews it every
#: third of this while it works, so only a dead (or frozen) replica's claim runs out, and
#: another takes the job over this long after.
DEFAULT_LEASE_S = 60.0
#: Seconds between looks for jobs other replicas queued (uploads to this one wake it).
DEFAULT_POLL_S = 1.0
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
    """One replica's thread that claims report jobs from the store and makes them."""

    def __init__(self, layout: Layout, store: ResultsStore, generate: ReportGenerator, *,
                 replica: str = DEFAULT_REPLICA, lease_s: float = DEFAULT_LEASE_S,
                 poll_s: float = DEFAULT_POLL_S) -> None:
        self._layout = layout
        self._store = store
        self._generate = generate
        self._replica = replica
        self._lease_s = lease_s
        self._poll_s = poll_s
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._busy = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Give up the claims this replica held before a restart, queue the reports of
        runs stored without a state, then start the thread.

        Blocking (store queries); raises ResultsStoreError when the store cannot say.
        """
        released = self._store.release_claims(self._replica)
        if released:
            log.info("replica %s: %d report(s) it was making before a restart are queued "
                     "again", self._replica, released)
        self._import_legacy_states()
        self._queue_stateless()
        # The thread lives as long as the service: the Allure CLI it starts is tied to
        # it (PR_SET_PDEATHSIG fires when the forking thread ends).
        self._thread = threading.Thread(target=self._loop, name="allure-reports",
                                        daemon=True)
        self._thread.start()

    def submit(self) -> None:
        """A run's "pending" state was just stored: look for jobs now, not at the next
        poll (other replicas find it at theirs)."""
        self._wake.set()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Finish the report in progress (up to ``timeout_s``); the rest stay pending."""
        self._stopping.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout_s)

    def wait_idle(self, timeout_s: float) -> bool:
        """True once no report is pending in the store, by this replica or another
        (tests and orderly shutdowns)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._busy.is_set() and not self._store.runs_awaiting_report():
                return True
            time.sleep(0.05)
        return False

    # -- what a previous process left -------------------------------------------

    def _queue_stateless(self) -> None:
        """Queue the runs with no report state at all whose files are here.

        Such a run was stored by `harness store`, or by an older service that died
        between committing the run and writing its state file. Queued only if still
        stateless: a replica starting beside this one may have queued it first.
        """
        skipped: list[str] = []
        queued = 0
        for run_id in self._store.runs_without_report():
            if not self._has_files(run_id):
                skipped.append(run_id)
            elif self._store.add_report_state(run_id, pending_state()):
                queued += 1
        if queued:
            log.info("queued %d report(s) of runs stored without one", queued)
        if skipped:
            more = f" and {len(skipped) - _LOGGED_IDS} more" if len(skipped) > _LOGGED_IDS else ""
            log.info("no report for %d stored run(s) whose files are not in %s (upload them "
                     "to make one): %s%s", len(skipped), self._layout.runs_dir,
                     ", ".join(skipped[:_LOGGED_IDS]), more)

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
                    self._store.add_report_state(run_id, state)
            elif self._store.get_run(run_id) is None:
                continue
            path.unlink(missing_ok=True)

    # -- the thread -------------------------------------------------------------

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                run_id = self._store.claim_report(self._replica, self._lease_s)
                if run_id is not None:
                    self._busy.set()
                    self._work(run_id)
            # Even the store failing must not end the worker: a claim it could not
            # finish is taken again when its lease ends, by this replica or another.
            except Exception:
                log.exception("report worker of replica %s", self._replica)
                run_id = None
            finally:
                self._busy.clear()
            if run_id is None:
                self._wake.wait(self._poll_s)
                self._wake.clear()

    def _work(self, run_id: str) -> None:
        run = self._store.get_run(run_id)
        states = self._store.report_states([run_id])
        if run is None or run_id not in states:
            return  # gone since the claim: nothing to make
        queued_ns = states[run_id].queued_ns
        if not self._has_files(run_id):
            state = ReportState(
                "failed", message=f"the run's files are not in {self._layout.runs_dir} "
                "(stored another way, or removed); upload the run again to make its report",
                queued_ns=queued_ns, updated_at=_now())
        else:
            with self._lease_kept(run_id):
                state = self._make(ReportJob.for_run(self._layout, run, queued_ns=queued_ns))
        if not self._store.finish_report(run_id, self._replica, state):
            log.warning("report of run %s: replica %s no longer holds its job (queued again, "
                        "or its lease of %g s ran out and another replica took it); this "
                        "outcome is not recorded", run_id, self._replica, self._lease_s)

    @contextlib.contextmanager
    def _lease_kept(self, run_id: str) -> Iterator[None]:
        """Renew the claim on ``run_id`` every third of its lease while the body runs."""
        done = threading.Event()

        def renew() -> None:
            while not done.wait(self._lease_s / 3):
                try:
                    if not self._store.renew_claim(run_id, self._replica, self._lease_s):
                        return  # lost: finish_report will say so
                except Exception:
                    log.exception("renewing the claim on the report of run %s", run_id)

        keeper = threading.Thread(target=renew, name=f"lease-{run_id}", daemon=True)
        keeper.start()
        try:
            yield
        finally:
            done.set()
            keeper.join()

    def _make(self, job: ReportJob) -> ReportState:
        layout = self._layout
        final = layout.report_dir(job.run_id)
        # Made in a folder of its own under this replica's tmp/ (emptied at its start,
        # same filesystem) and renamed in, so the report is served whole and a kill
        # leaves nothing in runs/.
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
            return ReportState("failed", message=f"{type(exc).__name__}: {exc}",
                               queued_ns=job.queued_ns, updated_at=_now())
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return ReportState("ready", problems=tuple(problems), queued_ns=job.queued_ns,
                           updated_at=_now())


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
