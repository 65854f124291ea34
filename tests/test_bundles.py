"""A fused bundle's ``manifest.json``: read into a Bundle, or refused with the key and fix.

The bundles here are made by hand (a manifest and empty model files), so the reader is
tested without writing the GGUF fixtures.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from harness.errors import FixtureError
from harness.facts.catalog import CatalogEntry, RuntimeClass
from harness.probes.bundles import SCHEMA, load_bundle

ENTRY = CatalogEntry(id="tiny-dense", runtime_class=RuntimeClass.FUSED, context_length=2048,
                     cache_type_k="f16", cache_type_v="f16",
                     drafter="text/tiny-dense-drafter.gguf", spec_type="draft-simple",
                     tags=("tiny", "llama"))


def _bundle(tmp_path: Path, **change: Any) -> Path:
    root = tmp_path / "fused-dense"
    (root / "text").mkdir(parents=True)
    for name in ("tiny-dense.gguf", "tiny-dense-drafter.gguf"):
        (root / "text" / name).write_bytes(b"GGUF")
    (root / "manifest.json").write_text(json.dumps({**ENTRY.to_json(), **change}),
                                        encoding="utf-8")
    return root


def test_a_written_manifest_reads_back(tmp_path: Path) -> None:
    bundle = load_bundle(_bundle(tmp_path))
    assert bundle.entry == ENTRY
    assert bundle.drafter_path == bundle.root / "text" / "tiny-dense-drafter.gguf"
    mtp = load_bundle(_bundle(tmp_path / "mtp", drafter=None, spec_type="draft-mtp"))
    assert mtp.entry.drafter is None
    assert mtp.drafter_path is None


def test_the_schema_holds_exactly_the_catalog_fields() -> None:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    assert list(schema["properties"]) == [f.name for f in fields(CatalogEntry)]
    assert schema["required"] == [f.name for f in fields(CatalogEntry)]
    assert schema["properties"]["runtime_class"]["enum"] == [r.value for r in RuntimeClass]


@pytest.mark.parametrize(("change", "where", "value", "allowed"), [
    ({"context_length": "2048"}, "$.context_length", '"2048" is not allowed',
     "allowed: type integer, >= 1"),
    ({"drafter": ""}, "$.drafter", '"" is not allowed',
     "allowed: type string or null, length >= 1 (the drafter's path inside the bundle, or "
     "null for none)"),
    ({"catalog": 1}, "$.catalog", "unknown key (value 1) is not allowed",
     "allowed keys: cache_type_k, cache_type_v, context_length, drafter, id, runtime_class, "
     "spec_type, tags"),
    ({"id": "../x"}, "$.id", '"../x" is not allowed', "a plain file-name stem"),
    ({"runtime_class": "python"}, "$.runtime_class", '"python" is not allowed',
     'allowed: one of "fused" (fused: the fused llama-cpp pipeline'),
    ({"tags": "tiny"}, "$.tags", '"tiny" is not allowed', "allowed: type array"),
])
def test_a_bad_manifest_names_the_file_key_and_allowed_values(
        tmp_path: Path, change: dict[str, Any], where: str, value: str, allowed: str) -> None:
    root = _bundle(tmp_path, **change)
    with pytest.raises(FixtureError) as info:
        load_bundle(root)
    lines = str(info.value).splitlines()
    line = next(ln for ln in lines if ln.startswith(f"{root / 'manifest.json'}: {where}: "))
    assert value in line
    assert allowed in line
    assert "written by `harness fixtures`" in lines[-1]


def test_a_missing_key_and_a_missing_manifest_are_named(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    manifest = root / "manifest.json"
    body = ENTRY.to_json()
    del body["spec_type"]
    manifest.write_text(json.dumps(body), encoding="utf-8")
    with pytest.raises(FixtureError, match=r"\$\.spec_type: missing required key; allowed: "
                                           r"type string or null"):
        load_bundle(root)
    manifest.unlink()
    with pytest.raises(FixtureError, match=r"manifest\.json: cannot read the file"):
        load_bundle(root)


def test_a_model_file_the_manifest_names_must_be_there(tmp_path: Path) -> None:
    root = _bundle(tmp_path)
    (root / "text" / "tiny-dense-drafter.gguf").unlink()
    with pytest.raises(FixtureError, match=r"tiny-dense-drafter\.gguf is missing; rewrite the "
                                           "fixtures with `harness fixtures`"):
        load_bundle(root)
