"""``harness run``: the main job — build, fixtures, suites, the run record into the store,
the Allure report."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click

from harness import modelgen
from harness.commands._progress import build_with_progress, console
from harness.commands.report import default_history_path
from harness.commands.store import store_run
from harness.errors import HarnessError
from harness.paths import SUITES_DIR, suites_pytest_config
from harness.planning.build_plan import SUITE_BUILD
from harness.plugin.recording.run_file import new_run_id
from harness.report.allure import generate_report
from harness.report.baseline_figures import baseline_picture
from harness.report.global_attachments import GlobalAttachment
from harness.results.run_record import RunRecord


@click.command("run", context_settings={"ignore_unknown_options": True})
@click.option("--alluredir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("allure-results"), show_default=True,
              help="Where allure-pytest writes the results (relative: to the working "
                   "directory).")
@click.option("--report-dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("allure-report"), show_default=True,
              help="Where the Allure HTML report is written.")
@click.option("--run-record", type=click.Path(path_type=Path, dir_okay=False),
              default=Path("harness-run") / "run.json", show_default=True,
              help="Where the run record (outcomes, hardware, build, figures) is written.")
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None,
              help="Results store for the run record [env HARNESS_RESULTS_URL; default: a "
                   "SQLite file in the harness cache].")
@click.option("--single-file", is_flag=True,
              help="Also write the report as one self-contained HTML file (a CI artifact).")
@click.option("--workers", default="auto", show_default=True,
              help="pytest-xdist workers for the suites.")
@click.option("--bundles", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=None,
              help="A folder of your own fused bundles (one subfolder each, in the fixtures' "
                   "layout): the suites parametrized over bundles run over them too "
                   "(--harness-bundles; env HARNESS_BUNDLES).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run_command(*, alluredir: Path, report_dir: Path, run_record: Path, results_url: str | None,
        single_file: bool, workers: str, bundles: Path | None,
        pytest_args: tuple[str, ...]) -> None:
    """The main job: build, fixtures, suites, run record into the store, Allure report."""
    result = build_with_progress(SUITE_BUILD, None)
    fixture_set = modelgen.ensure_fixtures()
    console.print(f"[bold]fixtures[/] {fixture_set.root}")
    alluredir, report_dir, run_record = (p.absolute() for p in (alluredir, report_dir, run_record))
    run_record.unlink(missing_ok=True)
    run_id = new_run_id()
    argv = [
        sys.executable, "-m", "pytest", str(SUITES_DIR), *suites_pytest_config(), "-n", workers,
        f"--alluredir={alluredir}", "--clean-alluredir",
        f"--harness-server-bin={result.info.binary}", f"--harness-run-record={run_record}",
        *([f"--harness-bundles={bundles.absolute()}"] if bundles else []), *pytest_args,
    ]
    console.print("[bold]running[/] " + " ".join(argv[2:]))
    code = subprocess.call(argv, env={**os.environ, "HARNESS_RUN_ID": run_id})
    console.print(f"[bold]Allure results[/] {alluredir}")
    pictures: tuple[GlobalAttachment, ...] = ()
    if run_record.is_file():
        stored, created, where = store_run(run_record, results_url)
        state = "stored" if created else "already stored"
        console.print(f"[bold]run {stored.run_id}[/] {state} in {where} "
                      f"({len(stored.figures)} figures); record {run_record}", soft_wrap=True)
        pictures = _baseline_picture(stored, results_url)
    else:
        console.print(f"no run record at {run_record}: pytest ended before writing it")
    report = generate_report(alluredir, report_dir, history_path=default_history_path(),
                             global_attachments=pictures)
    for problem in report.problems:
        console.print(f"warning: left out of the report: {problem}", markup=False)
    if single_file:
        single = generate_report(alluredir, report_dir.with_name(report_dir.name + "-single"),
                                 history_path=None, single_file=True)
        console.print(f"[bold]single-file report[/] {single.index_html}", soft_wrap=True)
    console.print(f"[bold]suites {'passed' if code == 0 else 'FAILED'}[/] (pytest exit {code})")
    console.print(f"[bold]Allure report[/] {report.index_html}", soft_wrap=True)
    sys.exit(code)


def _baseline_picture(run: RunRecord, results_url: str | None) -> tuple[GlobalAttachment, ...]:
    try:
        return baseline_picture(run, results_url)
    except HarnessError as exc:
        console.print(f"warning: no picture of the figures against the baseline: {exc}",
                      markup=False)
        return ()
