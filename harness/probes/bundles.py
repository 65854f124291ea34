"""Reads a fused bundle directory into a :class:`Bundle`, strictly.

The manifest is checked against resources/schemas/bundle-manifest.schema.json (the fields
of :class:`CatalogEntry`); the files it names must be there.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from harness.data_schema import load_json, schema_file
from harness.errors import FixtureError
from harness.facts.catalog import MANIFEST_NAME, Bundle, CatalogEntry

#: The manifest format: exactly CatalogEntry's fields.
SCHEMA = schema_file("bundle-manifest")
_FIX = ("a fixture bundle's manifest is written by `harness fixtures`; "
        "fixtures/models/README.md describes the layout")
_MISSING_FIX = "rewrite the fixtures with `harness fixtures`"


def load_bundle(root: Path, *, fix: str = _FIX, missing_fix: str = _MISSING_FIX) -> Bundle:
    """The bundle at ``root``. ``fix`` ends a manifest's problems and ``missing_fix`` a
    missing model's: a fixture's say how the fixtures are written, a user's bundle
    folder's describe the layout."""
    manifest = root / MANIFEST_NAME
    data: Mapping[str, Any] = load_json(manifest, SCHEMA, FixtureError, fix=fix)
    entry = CatalogEntry(
        id=data["id"],
        runtime_class=data["runtime_class"],
        context_length=int(data["context_length"]),
        cache_type_k=data["cache_type_k"],
        cache_type_v=data["cache_type_v"],
        drafter=data["drafter"],
        spec_type=data["spec_type"],
        tags=tuple(data["tags"]),
    )
    bundle = Bundle(root=root, entry=entry)
    for path in (bundle.text_model, bundle.drafter_path):
        if path is not None and not path.is_file():
            raise FixtureError(f"bundle {root}: {path} is missing"
                               + (f"; {missing_fix}" if missing_fix else ""))
    return bundle
