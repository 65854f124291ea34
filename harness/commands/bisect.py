"""``harness bisect``: from a good and a bad commit of a llama.cpp git tree to the first
bad commit, judged by a script or by suite tests, on cached incremental builds.

Exit 0 when the first bad commit is known, 1 when a range of candidates is left
(skipped commits, or the budget ran out), 2 when the endpoints do not reproduce the
regression or the bisect could not start. docs/bisect.md has the whole story.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import click
from rich.markup import escape

from harness.ab.decision import AbRule
from harness.ab.design import DESIGNS
from harness.ab.runner import AB_METRICS
from harness.bisect.bisector import FOUND, BisectResult, BisectSettings, Limits, bisect
from harness.bisect.history import resolve
from harness.bisect.metric_oracle import AUTO, MetricOracle, metric_settings
from harness.bisect.oracles import (
    DEFAULT_JUDGE_LIMIT_S,
    Oracle,
    ScriptOracle,
    TestOracle,
    check_test_ids,
)
from harness.bisect.ranges import (
    CommitRange,
    GitRange,
    ReleaseRange,
    inside_release,
    parse_release_ref,
)
from harness.bisect.table import progress_line, render_table
from harness.commands._build_options import build_options, build_request
from harness.commands._progress import console
from harness.errors import ConfigError
from harness.facts.commit_ids import short_commit
from harness.files import write_json_atomic
from harness.paths import cache_root
from harness.releases.release_source import available_releases
from harness.results.run_validation import add_to_run
from harness.service.settings import TOKEN_ENV
from harness.service.upload_client import attach_bisect

DEFAULT_RULE = AbRule()


@click.command("bisect")
@click.option("--source", "tree", default=None,
              type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="The llama.cpp git tree (a checkout or a fork) whose history is searched; "
                   "with release endpoints, where the search goes on inside the first bad "
                   "release (its tags bNNNN).")
@click.option("--good", required=True, metavar="REF",
              help="A commit (branch, tag, id) the oracle judges good, an ancestor of --bad; "
                   "or release:N, a published llama.cpp release.")
@click.option("--bad", required=True, metavar="REF",
              help="A commit (or release:N) the oracle judges bad.")
@click.option("--script", default=None, metavar="CMD",
              help="Oracle: a shell command, given the probed build in "
                   "HARNESS_BISECT_BINARY and HARNESS_BISECT_BUILD_JSON; exit 0 good, 125 "
                   "skip this commit, anything else bad (git bisect run's contract).")
@click.option("--test", "tests", multiple=True, metavar="NODEID",
              help="Oracle: suite tests (repeatable) that pass on good and fail on bad, "
                   "e.g. 'suites/test_plan_forwarding.py::test_x[p]'.")
@click.option("--metric", default=None, type=click.Choice(AB_METRICS),
              help="Oracle: this figure, each probe measured side by side against the good "
                   "and the bad build with the A/B machinery (harness ab).")
@click.option("--fixture", default="bench", show_default=True,
              help="With --metric: the fixture model the servers serve.")
@click.option("--threshold", type=click.FloatRange(0.001, 0.5),
              default=DEFAULT_RULE.threshold, show_default=True,
              help="With --metric: the relative change that counts (0.03 is 3 %).")
@click.option("--ab-budget-s", type=click.FloatRange(min=1), default=DEFAULT_RULE.budget_s,
              show_default=True, help="With --metric: seconds one comparison may measure "
                                      "before it is unknown.")
@click.option("--design", type=click.Choice((AUTO, *DESIGNS)), default=AUTO,
              show_default=True, help="With --metric: the A/B design (auto: what harness "
                                      "ab picks on this runner, else sequential).")
@click.option("--reruns", type=click.IntRange(min=0), default=1, show_default=True,
              help="With --test: run a failing probe again this many times; it is bad only "
                   "when it fails every time.")
@click.option("--first-parent", is_flag=True,
              help="Follow only the bad commit's first-parent line: a fork that merges "
                   "upstream blames the merge.")
@click.option("--budget-s", type=click.FloatRange(min=0), default=None,
              help="Stop probing after this many seconds (the endpoints always run); the "
                   "candidates left are printed and the journal resumes it.")
@click.option("--max-builds", type=click.IntRange(min=0), default=None,
              help="Stop probing after this many compiled builds (cache hits are free).")
@click.option("--judge-limit-s", type=click.FloatRange(min=1), default=DEFAULT_JUDGE_LIMIT_S,
              show_default=True, help="The longest one judgement may take.")
@build_options
@click.option("--out", type=click.Path(path_type=Path, file_okay=False),
              default=Path("harness-bisect"), show_default=True,
              help="Where each probe's output, result.json and table.md go.")
@click.option("--log", "journal", type=click.Path(path_type=Path, dir_okay=False),
              default=None, help="The journal of probes (default OUT/bisect.jsonl); an "
                                 "interrupted bisect given the same one continues from it.")
@click.option("--record", "run_json", type=click.Path(path_type=Path, dir_okay=False,
                                                      exists=True), default=None,
              help="Add the result to this run.json as its `bisect` object (the run whose "
                   "regression it explains); upload the run to show it on the service.")
@click.option("--attach", "attach_to", default=None, metavar="RUN_ID",
              help="Send the result to the results service (--service) as the bisect of "
                   "this stored run, the one whose regression it explains.")
@click.option("--service", envvar="HARNESS_SERVICE_URL", default=None,
              help="With --attach: the results service [env HARNESS_SERVICE_URL].")
@click.option("--token", envvar=TOKEN_ENV, default=None,
              help=f"With --attach: the service's token [env {TOKEN_ENV}].")
@click.option("--allure-results", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Add the bisect to this allure-results folder: one result "
                                 "with the table and a plot of the probes, the first bad "
                                 "commit marked.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the result as JSON on stdout instead of the table.")
def bisect_command(*, tree: Path | None, good: str, bad: str, script: str | None,
                   tests: tuple[str, ...], metric: str | None, fixture: str, threshold: float,
                   ab_budget_s: float, design: str, reruns: int, first_parent: bool,
                   budget_s: float | None, max_builds: int | None, judge_limit_s: float,
                   backend: str, native: bool, cmake_args: tuple[str, ...], cuda_archs: str,
                   amdgpu_targets: str, reduced: bool, rpc: bool, out: Path, journal: Path | None,
                   run_json: Path | None, attach_to: str | None, service: str | None,
                   token: str | None, allure_results: Path | None, as_json: bool) -> None:
    """Find the commit between --good and --bad that made the oracle fail."""
    request = build_request(backend=backend, native=native, cmake_args=cmake_args,
                            cuda_archs=cuda_archs, amdgpu_targets=amdgpu_targets,
                            reduced=reduced, rpc=rpc)
    if sum((script is not None, bool(tests), metric is not None)) != 1:
        raise click.UsageError("harness bisect needs one oracle: --script CMD, --test "
                               "NODEID (repeatable) or --metric NAME")
    oracle: Oracle
    if metric is not None:
        oracle = MetricOracle(metric_settings(
            metric, fixture=fixture, rule=AbRule(threshold=threshold, budget_s=ab_budget_s),
            design=design, backend=request.backend))
    else:
        oracle = _oracle(script, tests, reruns, judge_limit_s)
    if attach_to is not None and not (service and token):
        raise click.UsageError("--attach needs --service URL (or HARNESS_SERVICE_URL) and "
                               f"--token (or {TOKEN_ENV})")
    started = time.monotonic()
    out = out.absolute()
    journal = (journal or out / "bisect.jsonl").absolute()
    span = _range(tree, good, bad, first_parent)
    settings = BisectSettings(range=span, oracle=oracle, request=request,
                              cache=cache_root(), out=out, journal=journal,
                              limits=Limits(budget_s=budget_s, max_builds=max_builds))
    result = _run(settings, out / "result.json", out / "table.md")
    found = result.window.culprit if result.window is not None else None
    if isinstance(span, ReleaseRange) and tree is not None and found is not None \
            and result.exit_code == FOUND:
        # The first bad release is known: go on inside it, commit by commit.
        first_bad = result.history[found]
        inside = inside_release(tree.absolute(), result.history, found, first_parent)
        console.print(f"[bold]first bad release[/] {escape(first_bad.subject)}; continuing "
                      f"inside it in {tree}", soft_wrap=True)
        result = _run(replace(settings, range=inside,
                              journal=journal.with_name(f"{journal.stem}-git.jsonl")),
                      out / "result-git.json", out / "table-git.md")
    if run_json is not None:
        add_to_run(run_json, "bisect", result.to_json(), what="its bisect")
    if attach_to is not None and service and token:
        attach_bisect(service, attach_to, result.to_json(), token)
        console.print(f"[bold]attached[/] to run {escape(attach_to)} on {escape(service)}",
                      soft_wrap=True)
    if allure_results is not None:
        # Imported here: matplotlib is slow to import, and only this needs it.
        from harness.bisect.bisect_allure import write_allure_result  # noqa: PLC0415

        write_allure_result(result, allure_results, time.monotonic() - started)
    if as_json:
        click.echo(json.dumps(result.to_json(), indent=2))
    else:
        click.echo(render_table(result))
    sys.exit(result.exit_code)


def _range(tree: Path | None, good: str, bad: str, first_parent: bool) -> CommitRange:
    """Published releases when both endpoints name one, else commits of ``tree``."""
    releases = parse_release_ref(good), parse_release_ref(bad)
    if releases[0] is not None and releases[1] is not None:
        return ReleaseRange.between(releases[0], releases[1], available_releases())
    if releases != (None, None):
        raise click.UsageError("--good and --bad name two releases (release:N) or two git "
                               "refs, not one of each")
    if tree is None:
        raise click.UsageError("--source GIT_TREE is needed for git refs; without a tree, "
                               "name published releases: --good release:N --bad release:M")
    tree = tree.absolute()
    return GitRange(tree, resolve(tree, good), resolve(tree, bad), first_parent)


def _run(settings: BisectSettings, result_json: Path, table_md: Path) -> BisectResult:
    span = f"{short_commit(settings.good.sha)}..{short_commit(settings.bad.sha)}"
    console.print(f"[bold]bisect[/] {span} "
                  f"({escape(settings.range.describe())}) "
                  f"{escape(settings.oracle.describe())}; journal {settings.journal}",
                  soft_wrap=True)
    result = bisect(
        settings,
        starting=lambda commit: console.print(
            f"[dim]probing {short_commit(commit.sha)} {escape(commit.subject)}[/]", soft_wrap=True),
        report=lambda probe, state: console.print(escape(progress_line(probe, state)),
                                                  soft_wrap=True))
    result_json.parent.mkdir(parents=True, exist_ok=True)
    table_md.write_text(render_table(result) + "\n")
    write_json_atomic(result_json, result.to_json())
    return result


def _oracle(script: str | None, tests: tuple[str, ...], reruns: int,
            limit_s: float) -> Oracle:
    if script is not None:
        if not script.strip():
            raise click.BadParameter("an empty command judges nothing", param_hint="--script")
        return ScriptOracle(script, limit_s)
    try:
        return TestOracle(check_test_ids(tests), reruns=reruns, limit_s=limit_s)
    except ConfigError as exc:
        raise click.BadParameter(str(exc), param_hint="--test") from None
