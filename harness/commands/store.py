"""``harness store RUN_JSON...``: keep run records (``run.json``) in the results store."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from harness.errors import HarnessError
from harness.results.run_record import RunRecord
from harness.results.run_schema import MAX_DOCUMENT_BYTES
from harness.results.run_validation import parse_run_json
from harness.results.store import open_store


def read_run_json(path: Path) -> RunRecord:
    """Parse a ``run.json`` against the run schema; a refusal names the file and the field.

    Raises HarnessError: RunRecordError (with ``field``) for a broken record, a plain
    HarnessError for a file that cannot be read.
    """
    try:
        with path.open("rb") as handle:
            # One byte past the limit is enough for parse_run_json to refuse the size.
            data = handle.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise HarnessError(f"cannot read the run record {path}: {exc.strerror}") from exc
    return parse_run_json(data, source=str(path))


def store_runs(paths: Sequence[Path], results_url: str | None
               ) -> tuple[list[tuple[RunRecord, bool]], str]:
    """Store the runs in ``paths``, each file read and checked before any is stored (one
    that is not a run record stores none), over one connection; returns each run with
    whether it was new, and where they went."""
    runs = [read_run_json(path) for path in paths]
    with open_store(results_url) as store:
        return [(run, store.add_run(run)) for run in runs], store.url_for_display


def store_run(path: Path, results_url: str | None) -> tuple[RunRecord, bool, str]:
    """Store the run in ``path``; returns it, whether it was new, and where it went."""
    ((run, created),), where = store_runs([path], results_url)
    return run, created, where


@click.command("store")
@click.argument("run_json", nargs=-1, required=True,
                type=click.Path(path_type=Path, dir_okay=False))
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None,
              help="sqlite:///PATH or postgresql://… [env HARNESS_RESULTS_URL; default: a "
                   "SQLite file in the harness cache].")
def store_command(run_json: tuple[Path, ...], results_url: str | None) -> None:
    """Keep run records in the results store (a run already there is left as it is).

    Every file is read and checked first: one that is not a run record stops the command
    before any run is stored.
    """
    try:
        results, where = store_runs(run_json, results_url)
    except HarnessError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    for run, created in results:
        state = "stored" if created else "already stored"
        click.echo(f"{state}: run {run.run_id} ({run.branch}, {len(run.outcomes)} tests, "
                   f"{len(run.figures)} figures) in {where}")
