"""Recorded fixture hashes: ``fixtures/models/sha256.json`` and file hashing.

The record maps each fixture file's path relative to a fixture root (for example
``models/dense.gguf``, ``bundles/fused-dense/manifest.json``) to its sha256. It is
written by ``harness fixtures --record`` and committed, so a change in the writer's output shows
up as a diff and every machine can check its cached files against it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

from harness.errors import FixtureError
from harness.files import atomic_write_bytes

RECORD_NAME = "sha256.json"
_HEX64 = re.compile(r"[0-9a-f]{64}")


def read_hashes(path: Path) -> dict[str, str]:
    """Parse a hash record; every value must be a lowercase 64-digit hex sha256."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise FixtureError(
            f"{path}: cannot read the recorded fixture hashes ({exc}); "
            "regenerate them with `harness fixtures --record`"
        ) from exc
    if not isinstance(value, dict):
        raise FixtureError(f"{path}: expected a JSON object of relative path -> sha256")
    for rel, digest in value.items():
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise FixtureError(f"{path}: {rel!r} has no valid sha256 (got {digest!r})")
    return dict(value)


def write_hashes(path: Path, hashes: Mapping[str, str]) -> None:
    """Write a record with sorted keys, so regenerating it gives a minimal diff."""
    text = json.dumps(dict(sorted(hashes.items())), indent=2) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
