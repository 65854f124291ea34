"""``harness compare``: a stored run against its baseline; exit 1 when it regressed.

Exit codes: 0 no regression, 1 regression (a newly failing test, a figure worse
beyond noise, or a metric the current run's own A/B result calls regressed), 2 the
comparison could not be made (bad option, unknown run, store down, hardware mismatch).

``--service URL`` asks the results service (``GET /api/compare``) instead of opening
the store: CI runners reach the service but not its database. The exit codes are the
same; the service's refusal (409 on different hardware, 404 for an unknown run or
baseline) is printed in its own words.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import httpx
from click.core import ParameterSource

from harness.errors import HarnessError
from harness.http_bounds import MIB
from harness.probes.gpu_configs import load_gpu_configs
from harness.results.baseline_selection import select_baseline
from harness.results.comparison import compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.noise_rule import NoiseRule
from harness.results.rules import NOISE_MIN_RUNS, NOISE_THRESHOLD, NOISE_WINDOW, NOISE_Z
from harness.results.run_record import RunRecord
from harness.results.store import ResultsStore, open_store
from harness.results.store_backends import default_url
from harness.service.service_client import ServiceCall, reason

EXIT_OK = 0
EXIT_REGRESSED = 1
EXIT_ERROR = 2
COMPARE_PATH = "/api/compare"
#: The service compares in one database query round; a minute covers a busy service.
SERVICE_TIMEOUT_S = 60.0
#: A comparison lists every figure and test of one run: a few MiB for the largest runs.
SERVICE_MAX_BYTES = 16 * MIB


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
        comparison = compare(select_baseline(store, baseline, run, window), run, rule,
                             load_gpu_configs())
    if output_format == "json":
        text = json.dumps(comparison_json(comparison), indent=2, sort_keys=True) + "\n"
    else:
        text = comparison_markdown(comparison)
    return text, comparison.regressed


def _ask_service(service_url: str, params: dict[str, str]) -> tuple[ServiceCall, httpx.Response]:
    """``GET /api/compare`` with ``params``; a refusal or no answer is a HarnessError."""
    call = ServiceCall(service_url.rstrip("/"), "GET", COMPARE_PATH, SERVICE_TIMEOUT_S,
                       SERVICE_MAX_BYTES)
    response = call.send(params=params, accept=(200, 409))
    if response.status_code == 409:
        raise call.error(f"was refused (HTTP 409, different hardware): {reason(response)}",
                         409)
    return call, response


def _service_report(service_url: str, *, baseline: str, current: str, window: int,
                    rule: NoiseRule, output_format: str) -> tuple[str, bool]:
    """The service's comparison, rendered, and whether it regressed."""
    params = {"base": baseline, "head": current, "window": str(window),
              "threshold": repr(rule.threshold), "z": repr(rule.z),
              "min_runs": str(rule.min_runs)}
    # The verdict always comes from the JSON answer: the markdown one carries none.
    call, verdict = _ask_service(service_url, {**params, "format": "json"})
    body = call.json(verdict)
    if (not isinstance(body, dict) or not isinstance(body.get("regressed"), bool)
            or not isinstance(body.get("baseline_runs"), list) or not body["baseline_runs"]):
        raise call.error("answered without a comparison; is --service the address of "
                         "`harness serve`?")
    if output_format == "json":
        return json.dumps(body, indent=2, sort_keys=True) + "\n", body["regressed"]
    # The text is asked for with the anchor the verdict used, by run id, so a run
    # uploaded to the baseline branch in between cannot make it describe another
    # baseline than the verdict judged.
    text = _ask_service(service_url, {**params, "base": str(body["baseline_runs"][0]),
                                      "format": "markdown"})[1].text
    report = f"{service_url.rstrip('/')}/runs/{current}/report/"
    return (text.rstrip("\n") + f"\n\nAllure report of `{current}`: {report}\n",
            body["regressed"])


@click.command("compare")
@click.option("--baseline", metavar="SELECTOR",
              help="Required. What to compare with: `latest` (the newest earlier run on "
                   "this hardware), a run id, or a branch name.")
@click.option("--current", metavar="RUN_ID", default=None,
              help="The run to judge (default: the newest stored run; required with "
                   "--service).")
@click.option("--window", type=click.IntRange(min=1), default=NOISE_WINDOW,
              show_default=True,
              help="Baseline runs for figures: the named run and those before it.")
@click.option("--threshold", type=click.FloatRange(min=0), default=NOISE_THRESHOLD,
              show_default=True,
              help="Relative change a figure must exceed to count (0.05 = 5 %).")
@click.option("--z", "z", type=click.FloatRange(min=0), default=NOISE_Z, show_default=True,
              help="Standard deviations from the baseline mean a figure must exceed.")
@click.option("--min-runs", type=click.IntRange(min=2), default=NOISE_MIN_RUNS,
              show_default=True,
              help="Baseline runs a figure needs before it is judged.")
@click.option("--format", "output_format", type=click.Choice(["markdown", "json"]),
              default="markdown", show_default=True, help="Report format.")
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False), default=None,
              help="Also write the report to this file, replacing it "
                   "(e.g. $GITHUB_STEP_SUMMARY).")
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None, metavar="URL",
              help="Results store: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB "
                   "[env HARNESS_RESULTS_URL; default: a SQLite file in the harness cache].")
@click.option("--service", "service_url", metavar="URL", default=None,
              help="Ask the results service at URL (GET /api/compare) instead of opening "
                   "the store, e.g. on a CI runner that reaches only the service; needs "
                   "--current.")
@click.pass_context
def compare_command(ctx: click.Context, *, baseline: str | None, current: str | None, window: int,
                    threshold: float, z: float, min_runs: int, output_format: str,
                    output: Path | None, results_url: str | None,
                    service_url: str | None) -> None:
    """Compare a stored run with a baseline; exit 1 on a regression, 2 on an error."""
    if not baseline:
        # Checked here rather than by click so the message says what a selector is.
        raise click.UsageError("missing --baseline SELECTOR: `latest`, a stored run id, "
                               "or a branch name, e.g. --baseline main")
    if service_url is not None:
        if not current:
            # No default here: in CI other jobs upload at the same time, so "the newest
            # run on the service" need not be the one this job uploaded.
            raise click.UsageError("--service needs --current RUN_ID: the run this job "
                                   "uploaded (harness upload prints its id)")
        if ctx.get_parameter_source("results_url") is ParameterSource.COMMANDLINE:
            raise click.UsageError("--service and --results-url name two places to compare "
                                   "in; give one")
    try:
        rule = NoiseRule(threshold=threshold, z=z, min_runs=min_runs)
        if service_url is not None and current:
            text, regressed = _service_report(
                service_url, baseline=baseline, current=current, window=window, rule=rule,
                output_format=output_format)
        else:
            text, regressed = _report(
                baseline=baseline, current=current, window=window, rule=rule,
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
