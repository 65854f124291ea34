"""The fused bundle layout and its manifest (the catalog entry a runtime reads).

A bundle directory holds ``text/<id>.gguf``, ``text/<id>-drafter.gguf`` when the bundle
has a separate drafter, and ``manifest.json``. The GGUF files are byte-identical copies
of the fixtures they name.
"""

from __future__ import annotations

import json

from harness.facts.catalog import CatalogEntry, drafter_relpath, text_model_relpath
from harness.modelgen.bundle_specs import BundleSpec


def bundle_members(spec: BundleSpec) -> list[tuple[str, str]]:
    """``(path inside the bundle, fixture name)`` for each GGUF the bundle holds."""
    members = [(text_model_relpath(spec.id), spec.model)]
    if spec.drafter is not None:
        members.append((drafter_relpath(spec.id), spec.drafter))
    return members


def catalog_entry(spec: BundleSpec) -> CatalogEntry:
    return CatalogEntry(
        id=spec.id,
        runtime_class=spec.runtime_class,
        context_length=spec.context_length,
        cache_type_k=spec.cache_type_k,
        cache_type_v=spec.cache_type_v,
        drafter=drafter_relpath(spec.id) if spec.drafter is not None else None,
        spec_type=spec.spec_type.value,
        tags=spec.tags,
    )


def manifest_bytes(spec: BundleSpec) -> bytes:
    """The catalog entry, as stable JSON (fixed key order, trailing newline)."""
    text = json.dumps(catalog_entry(spec).to_json(), indent=2, ensure_ascii=False)
    return (text + "\n").encode("utf-8")
