"""Taking an uploaded bundle from a temp file to a stored run (blocking; run in a thread).

The order is what makes "nothing is written on refusal" and "nothing lost under
concurrency" hold:

1. unpack and check into ``tmp/`` (a refusal removes it; the runs folder is untouched);
2. under the run id's lock, if the store already has the run, stop: a repeat upload
   changes nothing;
3. rename the unpacked folder to ``runs/<run_id>`` (atomic, one filesystem);
4. add the run to the store; if that fails the folder is taken back out.

Files go in before the row so a crash between the two leaves a folder without a row,
which the next upload of that run replaces; the other order would leave a row whose
files never arrive. The locks only order uploads inside this process; the store's
unique run id settles any race beyond it.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
import zlib
from dataclasses import dataclass
from pathlib import Path

from harness.results.model import RunRecord
from harness.results.store import ResultsStore
from harness.service.bundle import safe_extract
from harness.service.layout import Layout

_LOCK_STRIPES = 64


@dataclass(frozen=True)
class Ingested:
    run: RunRecord
    #: The store did not have the run before this upload.
    created: bool
    #: This upload put the run's files in place, so its report should be made.
    files_placed: bool


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
        """Store the bundle in ``upload``; raises BundleRejectedError or ResultsStoreError."""
        layout = self._layout
        unpacked = layout.tmp_dir / f"bundle-{uuid.uuid4().hex}"
        bundle = safe_extract(upload, unpacked, max_bytes=self._max_unpacked_bytes,
                              max_members=self._max_members)
        run = bundle.run
        try:
            with self._locks[zlib.crc32(run.run_id.encode()) % _LOCK_STRIPES]:
                final = layout.run_dir(run.run_id)
                if self._store.get_run(run.run_id) is not None:
                    if final.is_dir():
                        return Ingested(run, created=False, files_placed=False)
                    # The row came another way (a direct store write): keep the files
                    # this upload brings so the run still gets its report.
                    self._place(unpacked, final)
                    return Ingested(run, created=False, files_placed=True)
                self._place(unpacked, final)
                try:
                    created = self._store.add_run(run)
                except BaseException:
                    shutil.rmtree(final, ignore_errors=True)
                    raise
                return Ingested(run, created=created, files_placed=True)
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
