"""``harness report``: render allure-results into an Allure 3 report with run history.

Problems with the input (a corrupt result file, a missing attachment) are warnings: the
rest is rendered. The last line on stdout is the report's index.html, for scripts.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from harness.commands.store import read_run_json
from harness.errors import HarnessError
from harness.paths import cache_root
from harness.report.allure import generate_report
from harness.report.baseline_figures import baseline_picture
from harness.report.global_attachments import GlobalAttachment

HISTORY_ENV = "HARNESS_ALLURE_HISTORY"
HISTORY_FILE = "allure-history.jsonl"


def default_history_path(environ: dict[str, str] | None = None) -> Path:
    """``$HARNESS_ALLURE_HISTORY``, else ``allure-history.jsonl`` in the harness cache."""
    env = dict(os.environ) if environ is None else environ
    value = env.get(HISTORY_ENV)
    return Path(value).expanduser() if value else cache_root(env) / HISTORY_FILE


@click.command("report")
@click.option("--results", "results_dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("allure-results"), show_default=True,
              help="The allure-results folder the suites wrote (--alluredir; relative: to "
                   "the working directory).")
@click.option("--output", "output_dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("allure-report"), show_default=True,
              help="Where the report goes; an earlier report there is replaced.")
@click.option("--history", "history_path", type=click.Path(path_type=Path, dir_okay=False),
              default=None,
              help=f"The run-history file the trend is drawn from and this run is added to "
                   f"(default: ${HISTORY_ENV}, else $HARNESS_CACHE/{HISTORY_FILE}).")
@click.option("--single-file", is_flag=True,
              help="One self-contained index.html that opens from disk (file://).")
@click.option("--run-record", type=click.Path(path_type=Path, dir_okay=False),
              default=Path("harness-run") / "run.json", show_default=True,
              help="The run's record: when it is there, the report's front page shows its "
                   "figures against the earlier runs of its branch in the results store.")
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None,
              help="The results store the baseline comes from [env HARNESS_RESULTS_URL; "
                   "default: the SQLite file in the harness cache].")
def report_command(*, results_dir: Path, output_dir: Path, history_path: Path | None,
                   single_file: bool, run_record: Path, results_url: str | None) -> None:
    """Render the suites' Allure results into a report; print its index.html."""
    pictures: tuple[GlobalAttachment, ...] = ()
    if run_record.is_file():
        try:
            pictures = baseline_picture(read_run_json(run_record), results_url)
        except HarnessError as exc:
            click.echo(f"warning: no picture of the figures against the baseline: {exc}",
                       err=True)
    result = generate_report(results_dir, output_dir,
                             history_path=history_path or default_history_path(),
                             single_file=single_file, global_attachments=pictures)
    for problem in result.problems:
        click.echo(f"warning: {problem}", err=True)
    click.echo(f"{result.tests} tests", err=True)
    click.echo(str(result.index_html))
