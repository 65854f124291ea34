"""Taking an uploaded bundle from a temp file to a stored run (blocking; run in a thread).

The order is what makes "nothing is written on refusal", "nothing lost under
concurrency" and "an acknowledged run gets its report" hold:

1. unpack and check into ``tmp/`` (a refusal removes it; the runs folder is untouched);
2. under the run id's lock, if the store already has the run and its files are here,
   stop: a repeat upload changes nothing;
3. rename the unpacked folder to ``runs/<run_id>`` (atomic, one filesystem);
4. add the run to the store with its report state "pending", in one transaction; if
   that fails the folder is taken back out. The caller then queues the report.

Files go in before the row so a crash between the two leaves a folder without a row,
which the next upload of that run replaces; the other order would leave a row whose
files never arrive. The state rides in the run's transaction so a crash after the
commit leaves a pending run, which the report worker queues again at start.

A run whose row came another way (`harness store`) but whose files are not here gets
them from the upload: its state is set pending first, then the files are placed, so a
crash in between leaves a pending run that the next upload completes.

Steps 2 to 4 hold two locks picked by the run id: a thread lock (uploads inside this
process) and a file lock in the shared data directory (uploads to other replicas of
the service). Without the file lock, an upload of the same run to a second replica
could see no row yet (the first's transaction still open), move the first's files
aside and put its own in their place while a report was read from them, or take
them out on a failed insert after the first's row had been committed.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from harness.bounded import bounded_lock
from harness.results.run_record import RunRecord
from harness.results.store import ResultsStore
from harness.results.store_backends import ResultsStoreError
from harness.service.bundle_extract import safe_extract
from harness.service.layout import Layout
from harness.service.reports import pending_state

_LOCK_STRIPES = 64
#: How long an upload waits for another replica's upload of a run id in its stripe (an
#: unpacked bundle's rename and one insert: far less, unless that replica is stuck).
INGEST_LOCK_WAIT_S = 60.0


@dataclass(frozen=True)
class Ingested:
    run: RunRecord
    #: The store did not have the run before this upload.
    created: bool
    #: This upload put the run's files in place, so its report should be made.
    files_placed: bool
    #: When the report was queued (``time.time_ns()``; 0 when none was).
    queued_ns: int = 0


class Ingestor:
    def __init__(self, layout: Layout, store: ResultsStore, *, max_unpacked_bytes: int,
                 max_members: int) -> None:
        self._layout = layout
        self._store = store
        self._max_unpacked_bytes = max_unpacked_bytes
        self._max_members = max_members
        # A fixed set of locks picked by run id: bounded memory, and two uploads of the
        # same run always meet on the same lock.
        self._locks = [threading.Lock() for _ in range(_LOCK_STRIPES)]

    def ingest(self, upload: Path) -> Ingested:
        """Store the bundle in ``upload``; raises BundleRejectedError or ResultsStoreError.

        When ``files_placed``, the run's state is "pending" in the store and the caller
        must queue its report.
        """
        layout = self._layout
        unpacked = layout.tmp_dir / f"bundle-{uuid.uuid4().hex}"
        bundle = safe_extract(upload, unpacked, max_bytes=self._max_unpacked_bytes,
                              max_members=self._max_members)
        run = bundle.run
        try:
            stripe = zlib.crc32(run.run_id.encode()) % _LOCK_STRIPES
            lock_file = layout.ingest_lock(stripe)
            lock_file.parent.mkdir(parents=True, exist_ok=True)
            with self._locks[stripe], bounded_lock(
                    lock_file, wait_s=INGEST_LOCK_WAIT_S, error=ResultsStoreError,
                    purpose=f"storing the upload of run {run.run_id}",
                    setting="harness.service.ingest.INGEST_LOCK_WAIT_S"):
                final = layout.run_dir(run.run_id)
                state = pending_state()
                if self._store.get_run(run.run_id) is not None:
                    if final.is_dir():
                        return Ingested(run, created=False, files_placed=False)
                    # The row came another way (a direct store write): keep the files
                    # this upload brings so the run still gets its report. Files first:
                    # any replica may claim the job the moment it is pending.
                    self._place(unpacked, final)
                    self._store.set_report_state(run.run_id, state)
                    return Ingested(run, created=False, files_placed=True,
                                    queued_ns=state.queued_ns)
                self._place(unpacked, final)
                try:
                    created = self._store.add_run(run, report=state)
                except BaseException:
                    shutil.rmtree(final, ignore_errors=True)
                    raise
                return Ingested(run, created=created, files_placed=True,
                                queued_ns=state.queued_ns)
        finally:
            shutil.rmtree(unpacked, ignore_errors=True)

    def _place(self, unpacked: Path, final: Path) -> None:
        final.parent.mkdir(parents=True, exist_ok=True)
        if final.exists():
            # Left by an upload that died before its row was stored: replace it whole.
            stale = self._layout.tmp_dir / f"stale-{uuid.uuid4().hex}"
            os.rename(final, stale)
            shutil.rmtree(stale, ignore_errors=True)
        os.rename(unpacked, final)
