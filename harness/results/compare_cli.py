"""``harness compare``: a stored run against its baseline; exit 1 when it regressed.

Exit codes: 0 no regression, 1 regression (a newly failing test or a figure worse
beyond noise), 2 the comparison could not be made (bad option, unknown run, store
down, hardware mismatch).
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from harness.errors import HarnessError
from harness.results.compare import NoiseRule, compare, select_baseline
from harness.results.model import RunRecord
from harness.results.store import ResultsStore, default_url, open_store

EXIT_OK = 0
EXIT_REGRESSED = 1
EXIT_ERROR = 2


def _current_run(store: ResultsStore, run_id: str | None) -> RunRecord:
    if run_id is None:
        newest = store.latest_run()
        if newest is None:
            raise HarnessError(f"the results store at {store.url_for_display} holds no "
                               "runs; run the suites to store one, or point "
                               "--results-url / HARNESS_RESULTS_URL at the right store")
        return newest
    found = store.get_run(run_id)
    if found is None:
        stored = ", ".join(run.run_id for run in store.list_runs(limit=5)) or "none"
        raise HarnessError(f"--current {run_id!r} is not a run in the results store at "
                           f"{store.url_for_display}; newest runs there: {stored}")
    return found


def _report(*, baseline: str, current: str | None, window: int, rule: NoiseRule,
            output_format: str, results_url: str | None) -> tuple[str, bool]:
    """The rendered comparison and whether it regressed."""
    with open_store(results_url) as store:
        run = _current_run(store, current)
        comparison = compare(select_baseline(store, baseline, run, window), run, rule)
    if output_format == "json":
        text = json.dumps(comparison.to_json(), indent=2, sort_keys=True) + "\n"
    else:
        text = comparison.to_markdown()
    return text, comparison.regressed


@click.command("compare")
@click.option("--baseline", metavar="SELECTOR",
              help="Required. What to compare with: `latest` (the newest earlier run on "
                   "this hardware), a run id, or a branch name.")
@click.option("--current", metavar="RUN_ID", default=None,
              help="The run to judge (default: the newest stored run).")
@click.option("--window", type=click.IntRange(min=1), default=5, show_default=True,
              help="Baseline runs for figures: the named run and those before it.")
@click.option("--threshold", type=click.FloatRange(min=0), default=0.05, show_default=True,
              help="Relative change a figure must exceed to count (0.05 = 5 %).")
@click.option("--z", "z", type=click.FloatRange(min=0), default=3.0, show_default=True,
              help="Standard deviations from the baseline mean a figure must exceed.")
@click.option("--min-runs", type=click.IntRange(min=2), default=3, show_default=True,
              help="Baseline runs a figure needs before it is judged.")
@click.option("--format", "output_format", type=click.Choice(["markdown", "json"]),
              default="markdown", show_default=True, help="Report format.")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write the report to this file, replacing it "
                   "(e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None, metavar="URL",
              help="Results store: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB "
                   "[env HARNESS_RESULTS_URL; default: a SQLite file in the harness cache].")
@click.pass_context
def compare_command(ctx: click.Context, *, baseline: str | None, current: str | None, window: int,
                    threshold: float, z: float, min_runs: int, output_format: str,
                    output: Path | None, results_url: str | None) -> None:
    """Compare a stored run with a baseline; exit 1 on a regression, 2 on an error."""
    if not baseline:
        # Checked here rather than by click so the message says what a selector is.
        raise click.UsageError("missing --baseline SELECTOR: `latest`, a stored run id, "
                               "or a branch name, e.g. --baseline main")
    try:
        text, regressed = _report(
            baseline=baseline, current=current, window=window,
            rule=NoiseRule(threshold=threshold, z=z, min_runs=min_runs),
            output_format=output_format,
            results_url=results_url if results_url else default_url())
        if output is not None:
            try:
                output.write_text(text, encoding="utf-8")
            except OSError as exc:
                raise HarnessError(f"cannot write the report to --output {output}: "
                                   f"{exc.strerror or exc}; check the directory exists "
                                   "and is writable") from exc
    except HarnessError as exc:
        click.echo(f"error: {exc}", err=True)
        ctx.exit(EXIT_ERROR)
    click.echo(text, nl=False)
    ctx.exit(EXIT_REGRESSED if regressed else EXIT_OK)
