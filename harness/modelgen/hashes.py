"""Recorded fixture hashes: ``fixtures/models/sha256.json`` and file hashing.

The record maps each fixture file's path relative to a fixture root (for example
``models/dense.gguf``, ``bundles/fused-dense/manifest.json``) to its sha256. It is
written by ``harness fixtures --record`` and committed, so a change in the writer's output shows
up as a diff and every machine can check its cached files against it. Reading checks it
against harness/resources/schemas/fixture-hashes.schema.json.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

from harness.data_schema import load_json, schema_file
from harness.errors import FixtureError
from harness.files import atomic_write_bytes

RECORD_NAME = "sha256.json"
SCHEMA = schema_file("fixture-hashes")


def read_hashes(path: Path) -> dict[str, str]:
    """Parse a hash record; every value must be a lowercase 64-digit hex sha256."""
    record: Mapping[str, str] = load_json(
        path, SCHEMA, FixtureError, fix="regenerate the record with `harness fixtures --record`")
    return dict(record)


def write_hashes(path: Path, hashes: Mapping[str, str]) -> None:
    """Write a record with sorted keys, so regenerating it gives a minimal diff."""
    text = json.dumps(dict(sorted(hashes.items())), indent=2) + "\n"
    atomic_write_bytes(path, text.encode("utf-8"))
