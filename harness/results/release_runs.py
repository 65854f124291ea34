"""The release matrix as stored runs, and back (pure).

``harness releases --store`` keeps each release's run record in the results store under
the branch ``releases``, labelled with the release it ran and whether it is the pin; the
dashboard's releases page rebuilds the matrix from those runs: per hardware, the newest
run of each release, its differences judged against the newest run of the pin.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace

from harness.results.release_matrix import ReleaseRow, row_from_record
from harness.results.run_record import RunRecord

#: The branch every release's run is stored under: one history per hardware.
RELEASES_BRANCH = "releases"
RELEASE_LABEL = "release"
PIN_LABEL = "pin"


def matrix_run(record: RunRecord, release: int, *, pinned: bool) -> RunRecord:
    """``record`` (one release's suite run) as the matrix stores it."""
    labels = {**record.labels, "job": "releases", RELEASE_LABEL: str(release),
              PIN_LABEL: "yes" if pinned else "no"}
    return replace(record, branch=RELEASES_BRANCH, labels=labels)


def release_of(run: RunRecord) -> int | None:
    """The release a stored matrix run ran; None for a run without a usable label."""
    value = run.labels.get(RELEASE_LABEL, "")
    return int(value) if value.isascii() and value.isdigit() and len(value) < 10 else None


def matrix_from_runs(runs: Iterable[RunRecord]) -> list[ReleaseRow]:
    """The matrix of the newest run of each release among ``runs`` (newest first, as
    ``list_runs`` gives them), the pin's first; a release's differences are judged
    against the newest run of the pin."""
    newest: dict[int, RunRecord] = {}
    pin: RunRecord | None = None
    for run in runs:
        release = release_of(run)
        if release is None or release in newest:
            continue
        newest[release] = run
        if pin is None and run.labels.get(PIN_LABEL) == "yes":
            pin = run
    rows = [row_from_record(release, run, pinned=run is pin,
                            pin=None if run is pin else pin)
            for release, run in newest.items()]
    return sorted(rows, key=lambda row: (not row.pinned, row.release))
