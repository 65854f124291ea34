"""``harness releases``: the suites over a span of published llama.cpp releases.

Each release's source is fetched from the package index (cached by version), built
natively for the CPU (ccache shares what releases have in common) and the suites run
against it, bounded. One row a release: passed, failed, skipped as unsupported,
differences found and harness errors. Exit 0 when every release ran and no harness
error came up, 1 otherwise, 2 on an error before any release ran.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import click
from rich.markup import escape

from harness import modelgen
from harness.builds.native import build_server
from harness.commands._progress import console, progress_bar
from harness.errors import ConfigError, HarnessError
from harness.files import write_json_atomic
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.releases.published import newest_releases, parse_release, select_releases
from harness.releases.release_source import (
    available_releases,
    fetch_release,
    pinned_release,
    release_build_request,
)
from harness.releases.suite_run import (
    DEFAULT_SUITE_TIMEOUT_S,
    SuiteOutcome,
    SuiteRun,
    run_suites,
)
from harness.results.release_matrix import ReleaseRow, render_table
from harness.results.release_runs import RELEASES_BRANCH, matrix_run
from harness.results.run_record import RunRecord
from harness.results.store import open_store


def _release(value: str) -> int:
    if value == "pin":
        return pinned_release()
    try:
        return parse_release(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command("releases", context_settings={"ignore_unknown_options": True})
@click.option("--from", "first", default=None, metavar="RELEASE",
              help="The oldest release of the span (10502, b10502, 10502.0.0 or pin).")
@click.option("--to", "last", default="pin", show_default=True, metavar="RELEASE",
              help="The newest release of the span.")
@click.option("--newest", type=click.IntRange(min=1), default=None, metavar="N",
              help="Instead of --from/--to: the N newest published releases (a nightly's "
                   "way to meet what users will build next).")
@click.option("--every", type=click.IntRange(min=1), default=None, metavar="N",
              help="Thin the span: a release every N release numbers, plus the newest.")
@click.option("--pin/--no-pin", "with_pin", default=True, show_default=True,
              help="Run the pinned release too, as the matrix's reference row.")
@click.option("--list", "list_only", is_flag=True,
              help="Print the releases the span would run and stop.")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False),
              default=Path("harness-releases"), show_default=True,
              help="Where each release's run record, pytest log and Allure results go, "
                   "with matrix.json and matrix.md.")
@click.option("--workers", default="auto", show_default=True,
              help="pytest-xdist workers for each release's suites.")
@click.option("--suite-timeout-s", type=click.FloatRange(min=1), show_default=True,
              default=DEFAULT_SUITE_TIMEOUT_S,
              help="A release's suites running longer than this are killed and its row "
                   "says it hung.")
@click.option("--store", "keep", is_flag=True,
              help="Keep each release's run record in the results store "
                   "(HARNESS_RESULTS_URL, else the default store) under the branch "
                   "`releases`, labelled with its release: the service's "
                   "/dashboard/releases page shows the matrix from them.")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def releases_command(*, first: str | None, last: str, newest: int | None, every: int | None,
                     with_pin: bool,
                     list_only: bool, out: Path, workers: str, suite_timeout_s: float,
                     keep: bool, pytest_args: tuple[str, ...]) -> None:
    """Run the suites against each published release of a span, one row a release."""
    if (first is None) == (newest is None):
        raise ConfigError("harness releases needs a span: --from RELEASE (the oldest of it) "
                          "or --newest N, not both")
    pin = pinned_release()
    available = available_releases()
    try:
        if newest is not None:
            first, last = str(newest_releases(available, newest)[0]), str(available[-1])
        assert first is not None
        chosen = select_releases(available, _release(first), _release(last), every,
                                 always=(pin,) if with_pin else ())
    except ValueError as exc:
        raise ConfigError(f"harness releases: {exc}") from exc
    console.print("[bold]releases[/] " + " ".join(f"b{r}" for r in chosen), soft_wrap=True)
    if list_only:
        return
    cache = cache_root()
    # Opened before any build: a store that cannot be reached fails now, not at the end.
    store = open_store() if keep else None
    modelgen.ensure_fixtures()
    settings = SuiteRun(out=out.absolute(), workers=workers, timeout_s=suite_timeout_s,
                        pytest_args=pytest_args)
    # The pin runs first: its run is the other side of every later release's differences.
    pin_record: RunRecord | None = None
    rows = []
    for release in sorted(chosen, key=lambda r: (r != pin, r)):
        outcome = _one_release(cache, release, settings, pinned=release == pin, pin=pin_record)
        if release == pin:
            pin_record = outcome.record
        if store is not None and outcome.record is not None:
            store.add_run(matrix_run(outcome.record, release, pinned=release == pin))
        rows.append(outcome.row)
    if store is not None:
        console.print(f"[bold]stored[/] in {store.url_for_display}, branch "
                      f"{RELEASES_BRANCH}", soft_wrap=True)
        store.close()
    table = render_table(rows)
    settings.out.mkdir(parents=True, exist_ok=True)
    (settings.out / "matrix.md").write_text(table + "\n")
    write_json_atomic(settings.out / "matrix.json", {"pin": pin,
                                                      "rows": [r.to_json() for r in rows]})
    click.echo(table)
    console.print(f"[bold]matrix[/] {settings.out / 'matrix.md'}", soft_wrap=True)
    sys.exit(1 if any(r.harness_errors or r.problem for r in rows) else 0)


def _one_release(cache: Path, release: int, settings: SuiteRun, *, pinned: bool,
                 pin: RunRecord | None) -> SuiteOutcome:
    started = time.monotonic()
    request = BuildRequest()
    try:
        tree = fetch_release(cache, release)
        request = release_build_request(tree.path)
        with progress_bar(request) as report:
            build = build_server(cache, tree, request, progress=report)
    except HarnessError as exc:
        first_line = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        row = ReleaseRow(release=release, pinned=pinned, problem=f"not built: {first_line}",
                         seconds=time.monotonic() - started)
        console.print(f"[bold]b{release}[/] {escape(row.problem or '')}", soft_wrap=True)
        return SuiteOutcome(row)
    console.print(f"[bold]b{release}[/] {build.info.version.splitlines()[0]} "
                  f"({'cache hit' if build.cache_hit else 'built'}); running the suites",
                  soft_wrap=True)
    ran = run_suites(release, build.binary, settings, pinned=pinned, pin=pin)
    # The row's minutes are the release's whole cost: fetch and build included.
    row = replace(ran.row, seconds=time.monotonic() - started)
    console.print(f"[bold]b{release}[/] {escape(json.dumps(row.to_json()))}", soft_wrap=True)
    return SuiteOutcome(row, ran.record)
