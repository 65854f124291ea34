"""Render allure-pytest results with the pinned Allure Report 3 CLI.

The CLI is found by harness/report/allure_cli.py; global attachments (a picture beside
the tests) are written into the staged results by harness/report/global_attachments.py.

The config is generated per run (``allurerc.json`` in a temporary folder, never in the
checkout): the Awesome report, the harness's failure categories, and ``historyPath`` —
a JSON-lines file outside the report folder that Allure reads for the trend and appends
this run to, so each report shows the runs before it. ``single_file`` makes Awesome
inline everything into one ``index.html`` that opens from ``file://``. Allure's analytics
tags are taken out of the pages before the report is put in place (``offline.py``).

Allure reads a staged copy of the results (``staging.py``), so one corrupt file costs
only itself, and writes into a fresh folder that replaces the old report only once the
new one is whole.

The CLI runs in its own process group and, on Linux, dies with the thread that started
it (``PR_SET_PDEATHSIG``): a ``kill -9`` of the caller leaves no ``node`` behind.
``temp_root`` keeps the staged copy and config inside a folder the caller owns and
sweeps (the results service passes its data directory's), rather than the system temp.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock

from harness.errors import HarnessError, ToolMissingError
from harness.parent_death import die_with_parent_hook
from harness.report.allure_cli import allure_command
from harness.report.allure_meta import categories_json
from harness.report.global_attachments import GlobalAttachment, write_global_attachments
from harness.report.offline import untrack_report
from harness.report.staging import HistoryUnreadableError, repair_history, stage_results

DEFAULT_REPORT_NAME = "llama-server regression harness"
#: Group the report's tree as allure-pytest labels the tests: package, module, class.
GROUP_BY = ("parentSuite", "suite", "subSuite")
OUTPUT_TAIL_LINES = 40
DEFAULT_TIMEOUT_S = 600.0


class ReportError(HarnessError):
    """The report could not be made from the results, or Allure failed."""


@dataclass(frozen=True)
class ReportResult:
    index_html: Path
    output_dir: Path
    #: ``"<path>: <why>"`` for each input file left out or incomplete.
    problems: tuple[str, ...]
    #: Tests in the report (Allure's count; retries of a test count once).
    tests: int


def report_config(output_dir: Path, *, report_name: str, single_file: bool,
                  history_path: Path | None,
                  categories: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Allure 3 config (``allurerc.json``) for one report (pure)."""
    config: dict[str, Any] = {
        "name": report_name,
        "output": str(output_dir),
        "plugins": {
            "awesome": {"options": {"reportName": report_name, "singleFile": single_file,
                                    "groupBy": list(GROUP_BY)}},
            # Allure adds its AI-agent output plugin unless one is configured; the
            # harness has no use for it, and a named, disabled one keeps it out.
            "agent": {"enabled": False},
        },
        # Allure 3 takes categories from its config; results' categories.json is only
        # read by the Allure 2 report.
        "categories": categories if categories is not None else categories_json(),
    }
    if history_path is not None:
        config["historyPath"] = str(history_path)
    return config


def generate_report(results_dir: Path, output_dir: Path, *, history_path: Path | None = None,
                    single_file: bool = False, report_name: str = DEFAULT_REPORT_NAME,
                    global_attachments: Sequence[GlobalAttachment] = (),
                    timeout_s: float = DEFAULT_TIMEOUT_S,
                    temp_root: Path | None = None) -> ReportResult:
    """Render ``results_dir`` into ``output_dir`` (replaced); see the module docstring.

    ``temp_root``: where the temporary folder goes (created if missing); None is the
    system temp.
    """
    results_dir = results_dir.resolve()
    output_dir = output_dir.resolve()
    _check_results_dir(results_dir)
    _check_replaceable(output_dir)
    command = allure_command()
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    if temp_root is not None:
        temp_root.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="harness-report-", dir=temp_root) as temp:
        staged = stage_results(results_dir, Path(temp) / "allure-results")
        problems += staged.problems
        if staged.results == 0:
            listed = "\n  ".join(problems)
            raise ReportError(f"no readable test result in {results_dir}; every "
                              f"*-result.json file is bad:\n  {listed}")
        # Into the staged copy: the results folder the user gave is left as it was.
        write_global_attachments(staged.directory, global_attachments, int(time.time() * 1000))
        history = _usable_history(history_path, problems)
        new_dir = output_dir.parent / f".{output_dir.name}.new-{uuid.uuid4().hex[:8]}"
        config = report_config(new_dir, report_name=report_name, single_file=single_file,
                               history_path=history, categories=staged.categories)
        config_path = Path(temp) / "allurerc.json"
        config_path.write_text(json.dumps(config, indent=2))
        argv = [*command, "generate", "--config", str(config_path), "--cwd", temp,
                str(staged.directory)]
        try:
            with _history_lock(history):
                output = _run_allure(argv, timeout_s)
            if not (new_dir / "index.html").is_file():
                raise ReportError(f"Allure exited 0 but wrote no index.html; its output:\n"
                                  f"{_tail(output)}")
            untrack_report(new_dir)  # no analytics request from a regression report
            _replace(output_dir, new_dir)
        finally:
            shutil.rmtree(new_dir, ignore_errors=True)
    return ReportResult(output_dir / "index.html", output_dir, tuple(problems),
                        _test_count(output_dir, staged.results))


def _check_results_dir(results_dir: Path) -> None:
    run_first = f"run the suites with `--alluredir {results_dir}` first, or pass --results"
    if not results_dir.is_dir():
        raise ReportError(f"the results folder {results_dir} does not exist; {run_first}")
    if not any(results_dir.glob("*-result.json")):
        raise ReportError(f"the results folder {results_dir} holds no *-result.json file; "
                          f"{run_first}")


def _check_replaceable(output_dir: Path) -> None:
    """Only an earlier report (or nothing) may be replaced: never a folder of other files."""
    if not output_dir.exists():
        return
    if output_dir.is_dir() and (not any(output_dir.iterdir())
                                or (output_dir / "index.html").is_file()):
        return
    raise ReportError(f"{output_dir} exists and is not an Allure report (no index.html); "
                      "pass another --output, or remove it")


def _usable_history(history_path: Path | None, problems: list[str]) -> Path | None:
    if history_path is None:
        return None
    history_path = history_path.resolve()
    try:
        history_path.parent.mkdir(parents=True, exist_ok=True)
        problems += repair_history(history_path)
    except HistoryUnreadableError as exc:
        problems.append(f"{exc}; the report has no history this time (remove the file to "
                        "start a new one)")
        return None
    except OSError as exc:
        problems.append(f"{history_path}: cannot be written ({exc.strerror or exc}); the "
                        "report has no history this time")
        return None
    return history_path


class _NoLock:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *_: object) -> None:
        return None


def _history_lock(history: Path | None) -> FileLock | _NoLock:
    # Two reports appending to one history at once would interleave their lines.
    return FileLock(f"{history}.lock") if history is not None else _NoLock()


def _tail(output: str) -> str:
    return "\n".join(output.splitlines()[-OUTPUT_TAIL_LINES:])


def _run_allure(argv: list[str], timeout_s: float) -> str:
    """Run the CLI; its stdout and stderr together, or ReportError when it fails."""
    env = {**os.environ, "NO_COLOR": "1", "FORCE_COLOR": "0"}
    try:
        # A session of its own: the whole group (node and anything it starts) can be
        # killed at once, and a terminal's Ctrl-C reaches it only through this process.
        # preexec_fn is unsafe with threads when it takes a lock another thread held at
        # the fork; this one takes none (see harness/parent_death.py).
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace", env=env,
                                start_new_session=True,
                                preexec_fn=die_with_parent_hook())  # noqa: PLW1509
    except OSError as exc:
        raise ToolMissingError(f"could not run {argv[0]} ({exc}); run `bash scripts/setup.sh`"
                               ) from exc
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        _kill_group(proc)
        raise ReportError(f"Allure did not finish within {timeout_s:g}s: "
                          f"`{' '.join(argv)}`") from exc
    except BaseException:
        # Interrupted (Ctrl-C, a stopping worker): the CLI must not outlive the wait.
        _kill_group(proc)
        raise
    output = stdout + stderr
    if proc.returncode != 0:
        raise ReportError(f"Allure failed with exit code {proc.returncode}: "
                          f"`{' '.join(argv)}`\n--- last lines of its output ---\n"
                          f"{_tail(output)}{_error_log(output)}")
    return output


def _kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the child's process group (it leads one), then reap the child."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError, AttributeError):
        proc.kill()
    proc.communicate()


#: Allure prints only this for an unexpected error and writes the error to a log file.
_LOG_POINTER = re.compile(r"Check logs for more details: (\S+\.log)")


def _error_log(output: str) -> str:
    """The head of the log file Allure's output points to (its error and stack)."""
    found = _LOG_POINTER.search(output)
    if found is None:
        return ""
    try:
        lines = Path(found[1]).read_text(errors="replace").splitlines()[:OUTPUT_TAIL_LINES]
    except OSError:
        return ""
    return f"\n--- {found[1]} ---\n" + "\n".join(lines)


def _replace(output_dir: Path, new_dir: Path) -> None:
    old_dir = output_dir.parent / f".{output_dir.name}.old-{uuid.uuid4().hex[:8]}"
    if output_dir.exists():
        output_dir.rename(old_dir)
    try:
        new_dir.rename(output_dir)
    except BaseException:
        if old_dir.exists():
            old_dir.rename(output_dir)  # the earlier report stays rather than none
        raise
    shutil.rmtree(old_dir, ignore_errors=True)


def _test_count(output_dir: Path, fallback: int) -> int:
    """``stats.total`` of the report's summary.json (Allure's own count)."""
    try:
        total = json.loads((output_dir / "summary.json").read_text())["stats"]["total"]
    except (OSError, ValueError, KeyError, TypeError):
        return fallback
    return total if isinstance(total, int) else fallback
