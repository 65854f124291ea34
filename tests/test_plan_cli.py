"""``harness plan`` on the fixture bundles, as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import modelgen
from harness.facts.build import Backend, BuildInfo, Capabilities
from harness.facts.gpu import STOCK_CACHE_TYPES
from harness.files import write_json_atomic

HARNESS = [sys.executable, "-c", "from harness.commands import main; main()"]
RTX_4090 = ["--gpu", "NVIDIA GeForce RTX 4090", "--vram-mib", "24564"]


@pytest.fixture(scope="module")
def build_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build record of an upstream build (what `harness build` writes)."""
    info = BuildInfo(key="cpu-test", backend=Backend.CPU, binary="/opt/llama-server",
                     version="version: test", source_digest="0" * 64, source_origin="test",
                     cmake_flags=(), compiler="gcc", build_seconds=1.0,
                     capabilities=Capabilities(cache_types_k=STOCK_CACHE_TYPES,
                                               cache_types_v=STOCK_CACHE_TYPES))
    path = tmp_path_factory.mktemp("build") / "build.json"
    write_json_atomic(path, info.to_json())
    return path


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HARNESS, "plan", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def plan_json(*args: str) -> dict[str, Any]:
    """``harness plan ARGS --json``, parsed; the command must succeed."""
    result = _plan(*args, "--json")
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.mark.parametrize("bundle", modelgen.BUNDLE_NAMES)
def test_json_plan_of_each_bundle(bundle: str, fixture_set: modelgen.FixtureSet,
                                  build_json: Path) -> None:
    data = plan_json(*RTX_4090, "--bundle", str(fixture_set.bundle(bundle)),
                 "--build", str(build_json))
    assert data["route"]["fused"] is True
    assert data["tune"]["label"] == "rtx-4090"
    assert data["argv"][0] == "/opt/llama-server"
    assert data["fields"]["cache_type_k"] == {"value": "q8_0", "origin": "capability-fallback"}
    assert {"cells", "k_bytes", "v_bytes"} <= set(data["kv"])
    assert any(w["code"] == "cache-type-fallback" for w in data["warnings"])


def test_overrides_on_a_bare_model(fixture_set: modelgen.FixtureSet, build_json: Path) -> None:
    data = plan_json("--model", str(fixture_set.model("dense")), "--ctx", "1024", "--parallel", "2",
                 "--cache-type-k", "f32", "--build", str(build_json))
    assert data["route"]["reason"] == "default"
    assert data["fields"]["ctx_size"] == {"value": 1024, "origin": "call"}
    assert data["fields"]["cache_type_k"] == {"value": "f32", "origin": "call"}
    assert data["kv"]["cells"] == 1024
    assert data["kv"]["k_bytes"] == 2 * data["kv"]["v_bytes"]  # f32 K, f16 V


def test_text_output_shows_fields_reasons_and_argv(fixture_set: modelgen.FixtureSet,
                                                   build_json: Path) -> None:
    result = _plan(*RTX_4090, "--bundle", str(fixture_set.bundle("fused-mtp")),
                   "--build", str(build_json))
    assert result.returncode == 0, result.stderr
    for heading in ("launch fields", "reasons", "argv", "KV cache"):
        assert heading in result.stdout
    assert "draft-mtp: limiting" in result.stdout


def test_bundle_and_model_together_is_a_usage_error(fixture_set: modelgen.FixtureSet) -> None:
    result = _plan("--bundle", str(fixture_set.bundle("fused-dense")),
                   "--model", str(fixture_set.model("dense")))
    assert result.returncode == 2
    assert "exactly one of --bundle PATH or --model PATH" in result.stderr


def test_a_corrupt_gguf_is_named(fixture_set: modelgen.FixtureSet) -> None:
    corrupt = fixture_set.model("drafter-corrupt")
    result = _plan("--model", str(corrupt))
    assert result.returncode == 2
    assert str(corrupt) in result.stderr
    assert "offset" in result.stderr
    assert "Traceback" not in result.stderr
