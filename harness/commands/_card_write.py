"""Writing a card config back (``harness calibrate --write``, ``harness tune --write``):
checked as the file it will be, beside its schema, before it replaces the file
atomically, so a bad write loses nothing. Keys are sorted, so writing the same content
again changes no byte."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from harness.errors import ConfigError, HarnessError
from harness.files import write_json_atomic
from harness.probes.gpu_configs import GPU_CONFIG_DIR, GPU_SCHEMA_NAME, load_gpu_configs


def write_card_checked(path: Path, updated: dict[str, Any], *, section: str,
                       error: type[HarnessError]) -> None:
    """Replace ``path`` with ``updated``, or raise ``error`` naming ``section`` when the
    result would not load as a card."""
    schema = path.parent / GPU_SCHEMA_NAME
    if not schema.is_file():
        schema = GPU_CONFIG_DIR / GPU_SCHEMA_NAME
    with tempfile.TemporaryDirectory() as scratch:
        trial = Path(scratch) / path.name
        trial.write_text(json.dumps(updated, indent=2, sort_keys=True) + "\n")
        (Path(scratch) / GPU_SCHEMA_NAME).write_text(schema.read_text())
        try:
            load_gpu_configs(Path(scratch))
        except ConfigError as exc:
            raise error(f"{path}: the {section} section would not be valid, so nothing "
                        f"was written: {exc}") from exc
    write_json_atomic(path, updated)
