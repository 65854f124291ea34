"""The fused bundle layout and its manifest (the catalog entry a runtime reads).

A bundle directory holds ``text/<id>.gguf``, ``text/<id>-drafter.gguf`` when the bundle
has a separate drafter, and ``manifest.json``. The GGUF files are byte-identical copies
of the fixtures they name.
"""

from __future__ import annotations

import json

from harness.modelgen.bundle_specs import BundleSpec

MANIFEST = "manifest.json"


def model_relpath(spec: BundleSpec) -> str:
    return f"text/{spec.id}.gguf"


def drafter_relpath(spec: BundleSpec) -> str | None:
    return f"text/{spec.id}-drafter.gguf" if spec.drafter is not None else None


def bundle_members(spec: BundleSpec) -> list[tuple[str, str]]:
    """``(path inside the bundle, fixture name)`` for each GGUF the bundle holds."""
    members = [(model_relpath(spec), spec.model)]
    drafter = drafter_relpath(spec)
    if drafter is not None and spec.drafter is not None:
        members.append((drafter, spec.drafter))
    return members


def manifest_bytes(spec: BundleSpec) -> bytes:
    """The catalog entry, as stable JSON (fixed key order, trailing newline)."""
    entry = {
        "id": spec.id,
        "runtime_class": spec.runtime_class,
        "context_length": spec.context_length,
        "cache_type_k": spec.cache_type_k,
        "cache_type_v": spec.cache_type_v,
        "drafter": drafter_relpath(spec),
        "spec_type": spec.spec_type.value,
        "tags": list(spec.tags),
    }
    return (json.dumps(entry, indent=2, ensure_ascii=False) + "\n").encode("utf-8")
