"""``harness calibrate``: per-card figures from the nightly runs a results service holds.

Reads every run of the branches asked for (``GET /api/runs``, then each whole record),
maps each run to a card config (harness/results/calibration.py says how), prints one row
per card, bundle, figure key and figure — extrapolated, measured, runs, spread, change —
and with ``--write`` replaces each card's ``measured`` section in its config file with
what at least ``--min-runs`` nights measured. A written config is checked against the
GPU config schema before it replaces the file (atomically), so a bad write loses
nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import httpx
from rich.console import Console
from rich.table import Table

from harness.commands._card_write import write_card_checked
from harness.errors import HarnessError
from harness.http_bounds import MIB
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs
from harness.results.calibration import (
    CalibrationRow,
    calibrate,
    key_label,
    measured_section,
    with_measured,
)
from harness.results.run_record import RunRecord
from harness.results.run_schema import MAX_DOCUMENT_BYTES
from harness.results.run_validation import RunRecordError, run_from_json
from harness.service.service_client import ServiceCall

#: Each call's whole time: the listing, then each run's record.
TIMEOUT_S = 30.0
#: ``GET /api/runs`` answers at most 1000 short summaries (--limit): well under this.
LISTING_MAX_BYTES = 8 * MIB
#: ``GET /api/runs/{id}``: one run.json (at most MAX_DOCUMENT_BYTES) and its summary.
RUN_MAX_BYTES = MAX_DOCUMENT_BYTES + MIB


class CalibrationError(HarnessError):
    """A run the service sent cannot be read, or a config could not be written.

    A call the service did not answer as it should is a ServiceError (service_client.py).
    """


@click.command("calibrate")
@click.option("--service", envvar="HARNESS_SERVICE_URL", required=True,
              help="The results service holding the nightly runs [env HARNESS_SERVICE_URL].")
@click.option("--branch", "branches", multiple=True, required=True,
              help="A branch, or a prefix ending in / (nightly/ is every nightly cell); "
                   "repeatable.")
@click.option("--configs", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=None, help="The card configs to map runs to and to write "
                                 "(default: the packaged configs/gpu).")
@click.option("--min-runs", type=click.IntRange(min=1), default=3, show_default=True,
              help="Write no measured figure from fewer nights than this.")
@click.option("--limit", type=click.IntRange(1, 1000), default=1000, show_default=True,
              help="The newest runs to read.")
@click.option("--write", is_flag=True, help="Write each card's measured section.")
def calibrate_command(*, service: str, branches: tuple[str, ...], configs: Path | None,
                      min_runs: int, limit: int, write: bool) -> None:
    """Per-card figures over nightly runs; --write records them in the card configs."""
    folder = configs or GPU_CONFIG_DIR
    try:
        cards = load_gpu_configs(folder)
        runs = fetch_runs(service.rstrip("/"), branches, limit)
    except HarnessError as exc:
        raise click.ClickException(str(exc)) from exc
    rows = calibrate(runs, cards)
    console = Console(soft_wrap=True)
    console.print(f"{len(runs)} runs of {', '.join(branches)}; "
                  f"{len({r.card for r in rows})} cards matched", highlight=False)
    console.print(_table(rows, min_runs))
    if write:
        for card in sorted({r.card for r in rows}):
            written = write_measured(folder / f"{card}.json",
                                     [r for r in rows if r.card == card], min_runs)
            console.print(f"{'wrote' if written else 'left'} {folder / f'{card}.json'}: "
                          f"{written} measured entries"
                          + ("" if written else f" (every group under {min_runs} runs)"),
                          highlight=False)


def fetch_runs(service: str, branches: tuple[str, ...], limit: int) -> list[RunRecord]:
    """The whole records of the newest ``limit`` runs whose branch is asked for."""
    listing = ServiceCall(service, "GET", "/api/runs", TIMEOUT_S, LISTING_MAX_BYTES)
    with httpx.Client() as client:
        listed = listing.json_object(listing.send(client, params={"limit": limit}))
        rows = listed.get("runs")
        if not isinstance(rows, list):
            raise listing.error("sent no list of runs; is --service the address of "
                                "`harness serve`?")
        ids = [str(r["run_id"]) for r in rows
               if isinstance(r, dict) and "run_id" in r
               and _wanted(str(r.get("branch", "")), branches)]
        return [_fetch_run(client, service, run_id) for run_id in ids]


def _fetch_run(client: httpx.Client, service: str, run_id: str) -> RunRecord:
    call = ServiceCall(service, "GET", f"/api/runs/{quote(run_id, safe='')}", TIMEOUT_S,
                       RUN_MAX_BYTES)
    try:
        return run_from_json(call.json_object(call.send(client))["run"])
    except (RunRecordError, KeyError, TypeError) as exc:
        raise CalibrationError(f"the results service at {service} sent a run this harness "
                               f"cannot read ({call.method} {call.path}): {exc}") from exc


def write_measured(path: Path, rows: Sequence[CalibrationRow], min_runs: int) -> int:
    """Replace ``path``'s measured section; the number of entries written (0: none)."""
    section = measured_section(rows, min_runs)
    entries = sum(len(keys) for keys in section.values())
    if not entries:
        return 0
    original: dict[str, Any] = json.loads(path.read_text())
    write_card_checked(path, with_measured(original, section), section="measured",
                       error=CalibrationError)
    return entries


def _wanted(branch: str, branches: tuple[str, ...]) -> bool:
    return any(branch == b or (b.endswith("/") and branch.startswith(b)) for b in branches)


def _table(rows: Sequence[CalibrationRow], min_runs: int) -> Table:
    table = Table(title="measured per card (runs under --min-runs are not written)")
    for column in ("card", "bundle", "figure key", "metric", "extrapolated", "measured",
                   "runs", "spread", "change"):
        table.add_column(column)
    for row in rows:
        change = "" if row.change is None else f"{row.change:+.1%}"
        table.add_row(row.card, row.bundle, key_label(row.key), row.metric,
                      "" if row.extrapolated is None else f"{row.extrapolated:g}",
                      f"{row.measured:.4g}",
                      f"{row.runs}" + ("" if row.runs >= min_runs else " (few)"),
                      "" if row.spread is None else f"{row.spread:.1%}", change)
    return table
