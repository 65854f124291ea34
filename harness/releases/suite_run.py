"""Runs the suites against one release's build, bounded, and reads back its row.

The suites run in their own pytest process (as ``harness run`` runs them), in a process
group of their own, so a release that hangs the suites past ``timeout_s`` is killed
whole — servers included — and its row says it hung instead of the matrix waiting.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from harness.bounded import stop_group
from harness.errors import HarnessError
from harness.paths import SUITES_DIR, suites_pytest_config
from harness.plugin.recording.run_file import new_run_id
from harness.results.release_matrix import (
    HUNG,
    ReleaseRow,
    findings,
    render_findings,
    row_from_record,
)
from harness.results.run_record import RunRecord
from harness.results.run_validation import parse_run_json

#: The suites a release matrix runs: every one that runs the release's own binary.
RELEASE_MARKERS = "not docker"
#: The longest a release's suites may run before the matrix calls them hung: the
#: suites take minutes on the pin, and each test has pytest's own 600 s bound.
DEFAULT_SUITE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class SuiteRun:
    """Where one release's suites write, and how they are run."""

    out: Path
    workers: str = "auto"
    timeout_s: float = DEFAULT_SUITE_TIMEOUT_S
    pytest_args: tuple[str, ...] = ()

    def folder(self, release: int) -> Path:
        return self.out / f"b{release}"


def suite_argv(binary: Path, folder: Path, settings: SuiteRun) -> list[str]:
    """The pytest command line for one release (pure)."""
    return [sys.executable, "-m", "pytest", str(SUITES_DIR), *suites_pytest_config(folder),
            "-n", settings.workers, f"--alluredir={folder / 'allure-results'}",
            "--clean-alluredir", f"--harness-server-bin={binary}",
            f"--harness-run-record={folder / 'run.json'}", "-p", "no:cacheprovider",
            # The container suites build and run the pin's images, whatever the release:
            # they say nothing about it and cost a CUDA image build. A later -m wins.
            "-m", RELEASE_MARKERS, *settings.pytest_args]


@dataclass(frozen=True)
class SuiteOutcome:
    row: ReleaseRow
    #: The run's record; None when the run left none (the row says why).
    record: RunRecord | None = None


def run_suites(release: int, binary: Path, settings: SuiteRun, *, pinned: bool = False,
               pin: RunRecord | None = None) -> SuiteOutcome:
    """Run the suites against ``binary``: the release's row and its run record.

    The pytest output goes to ``<out>/b<release>/pytest.log``; ``pin`` is the pin's run,
    the other side of every difference.
    """
    folder = settings.folder(release)
    return run_bounded(release, suite_argv(binary, folder, settings), folder,
                       settings.timeout_s, pinned=pinned, pin=pin)


def run_bounded(release: int, argv: list[str], folder: Path, timeout_s: float, *,
                pinned: bool = False, pin: RunRecord | None = None) -> SuiteOutcome:
    """Run ``argv`` (a suite run writing ``folder/run.json``) in ``folder``, bounded.

    A run past ``timeout_s`` is killed with its process group and becomes a row whose
    problem starts "hung"; a run that ends without a record becomes a row that says so
    with the log's last line.
    """
    folder.mkdir(parents=True, exist_ok=True)
    record_path = folder / "run.json"
    record_path.unlink(missing_ok=True)
    log_path = folder / "pytest.log"
    started = time.monotonic()
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=folder,
                                start_new_session=True,
                                env={**os.environ, "HARNESS_RUN_ID": new_run_id()})
        try:
            code = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            # The suites' servers are children of pytest's workers: only the whole
            # tree reaches them.
            stop_group(proc)
            return SuiteOutcome(ReleaseRow(
                release=release, pinned=pinned, seconds=time.monotonic() - started,
                problem=f"{HUNG}: the suites ran past {timeout_s:.0f} s and were killed; "
                        f"log {log_path}"))
    seconds = time.monotonic() - started
    if not record_path.is_file():
        return SuiteOutcome(ReleaseRow(
            release=release, pinned=pinned, seconds=seconds,
            problem=f"pytest exit {code} wrote no run record: {_last_line(log_path)} "
                    f"(log {log_path})"))
    try:
        record = parse_run_json(record_path.read_bytes(), source=str(record_path))
    except HarnessError as exc:
        return SuiteOutcome(ReleaseRow(release=release, pinned=pinned, seconds=seconds,
                                       problem=f"unreadable run record: {exc}"))
    (folder / "findings.md").write_text(render_findings(release, findings(record, pin)))
    return SuiteOutcome(row_from_record(release, record, pinned=pinned, seconds=seconds,
                                        where=str(record_path), pin=pin), record)


def _last_line(path: Path) -> str:
    try:
        lines = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return "no log"
    return lines[-1][:300] if lines else "empty log"
