"""Reads a fused bundle directory into a :class:`Bundle`, strictly."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.errors import FixtureError
from harness.facts.catalog import MANIFEST_NAME, Bundle, CatalogEntry
from harness.strictjson import check_keys, read_object

_KEYS = tuple(field.name for field in dataclasses.fields(CatalogEntry))


def load_bundle(root: Path) -> Bundle:
    manifest = root / MANIFEST_NAME
    data = read_object(manifest)
    check_keys(manifest, data, _KEYS, ())
    try:
        entry = CatalogEntry(
            id=str(data["id"]),
            runtime_class=str(data["runtime_class"]),
            context_length=int(data["context_length"]),
            cache_type_k=str(data["cache_type_k"]),
            cache_type_v=str(data["cache_type_v"]),
            drafter=str(data["drafter"]) if data["drafter"] else None,
            spec_type=str(data["spec_type"]) if data["spec_type"] else None,
            tags=tuple(str(tag) for tag in data["tags"]),
        )
    except (ValueError, TypeError) as exc:
        raise FixtureError(f"bundle {root} has a bad manifest: {exc}") from exc
    bundle = Bundle(root=root, entry=entry)
    for path in (bundle.text_model, bundle.drafter_path):
        if path is not None and not path.is_file():
            raise FixtureError(f"bundle {root}: {path} is missing; rewrite the fixtures with "
                               "`harness fixtures`")
    return bundle
