"""``harness doctor``: one table of everything a run depends on, and whether it can run.

Gathers the facts on this machine (``harness.doctor.gather``), judges them
(``harness.doctor.checks``, pure) and prints a table or JSON. Exit 1 when something the
run asked for needs is broken (with ``--backend``: what that backend needs; without:
Python, the key packages, the build toolchain, the GPU configs), else 0.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from harness.doctor.checks import Row, Status, doctor_rows, exit_code, verdict
from harness.doctor.gather import gather_facts
from harness.doctor.spread_answers import device_answers
from harness.doctor.spread_rows import spread_rows
from harness.facts.build import Backend
from harness.paths import cache_root
from harness.probes.device_list import load_device_list

_STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red", Status.NA: "dim"}
#: A table printed into a CI log (not a terminal) is not cut to 80 columns.
_LOG_WIDTH = 200


@click.command("doctor")
@click.option("--backend", type=click.Choice([b.value for b in Backend]), default=None,
              help="The backend a run will use: what it needs must be here (exit 1 if not). "
                   "Without it every check is shown and only Python, the packages, the "
                   "toolchain and the GPU configs can fail.")
@click.option("--device-config", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A device list (configs/gpu/devices/README.md): one more row per device, "
                   "what it answers here (an RPC endpoint's connection and listing, a card "
                   "among the build's devices); a device that does not answer fails.")
@click.option("--json", "as_json", is_flag=True, help="Print the rows and verdict as JSON.")
@click.pass_context
def doctor_command(ctx: click.Context, *, backend: str | None, device_config: Path | None,
                   as_json: bool) -> None:
    """Check this machine: packages, toolchain, Allure, Docker, GPUs and their configs,
    build cache, results store and service; each row with its fix."""
    wanted = Backend(backend) if backend is not None else None
    facts = gather_facts()
    rows = doctor_rows(facts, wanted)
    if device_config is not None:
        devices = load_device_list(device_config, facts.gpu_configs)
        rows = (*rows, *spread_rows(devices, device_answers(devices, cache_root())))
    code = exit_code(rows)
    if as_json:
        click.echo(json.dumps({"backend": backend, "exit_code": code,
                               "verdict": verdict(rows, wanted),
                               "rows": [row.to_json() for row in rows]}, indent=2))
    else:
        console = Console()
        if not console.is_terminal:
            console = Console(width=_LOG_WIDTH)
        console.print(_table(rows, wanted))
        console.print(verdict(rows, wanted))
    ctx.exit(code)


def _table(rows: list[Row] | tuple[Row, ...], backend: Backend | None) -> Table:
    title = f"harness doctor --backend {backend.value}" if backend else "harness doctor"
    table = Table(title=title, show_lines=False)
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for row in rows:
        # Text, not markup: tool output holds brackets ("Navi 22 [Radeon RX 6700]").
        table.add_row(Text(row.check), Text(row.status.value, style=_STYLE[row.status]),
                      Text(row.detail), Text(row.fix))
    return table
