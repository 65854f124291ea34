"""The drafter decision (pure): spec type, leaving the drafter out, broken drafters."""

from __future__ import annotations

import dataclasses

import pytest

from harness.planning.drafter import (
    BrokenDrafters,
    DrafterInputs,
    KvOutcome,
    decide_drafter,
)

BASE = DrafterInputs(
    explicit_spec_type=None, catalog_spec_type="draft-simple", drafter_path="/b/text/d.gguf",
    drafter_is_explicit=False, model_has_mtp=False, drafter_has_mtp=False, build_key="cpu-1",
    broken=frozenset(), slots=4,
)
SAME = KvOutcome(8192, "f16", "f16")


def _with(**changes: object) -> DrafterInputs:
    return dataclasses.replace(BASE, **changes)  # type: ignore[arg-type]


@pytest.mark.parametrize(("inputs", "spec_type", "drafter"), [
    pytest.param(BASE, "draft-simple", "/b/text/d.gguf", id="catalog-spec-type"),
    pytest.param(_with(explicit_spec_type="ngram-simple"), "ngram-simple", "/b/text/d.gguf",
                 id="explicit-beats-catalog"),
    pytest.param(_with(catalog_spec_type=None, drafter_path=None), None, None,
                 id="nothing-no-speculation"),
    pytest.param(_with(catalog_spec_type=None, drafter_path=None, model_has_mtp=True),
                 "draft-mtp", None, id="mtp-head-implies-draft-mtp"),
    pytest.param(_with(catalog_spec_type="draft-mtp", drafter_path=None), None, None,
                 id="draft-mtp-without-head-dropped"),
    pytest.param(_with(explicit_spec_type="draft-mtp"), None, None,
                 id="explicit-draft-mtp-without-head-dropped"),
    pytest.param(_with(catalog_spec_type="draft-mtp", model_has_mtp=True), "draft-mtp", None,
                 id="own-head-gets-no-drafter-file"),
    pytest.param(_with(catalog_spec_type="draft-mtp", drafter_has_mtp=True), "draft-mtp",
                 "/b/text/d.gguf", id="companion-mtp-file-passed"),
    pytest.param(_with(explicit_spec_type="none"), None, None, id="explicit-none"),
])
def test_spec_type_and_drafter(inputs: DrafterInputs, spec_type: str | None,
                               drafter: str | None) -> None:
    decision = decide_drafter(inputs)
    assert decision.spec_type == spec_type
    assert decision.drafter_path == drafter


def test_draft_mtp_without_head_says_why() -> None:
    decision = decide_drafter(_with(catalog_spec_type="draft-mtp"))
    assert any("failed to create MTP context" in r for r in decision.reasons)


@pytest.mark.parametrize(("inputs", "left_out", "why"), [
    pytest.param(_with(with_drafter=SAME, without_drafter=SAME), False, None, id="no-cost-kept"),
    pytest.param(_with(with_drafter=KvOutcome(4096, "f16", "f16"), without_drafter=SAME), True,
                 "4096 tokens", id="context-shrinks"),
    pytest.param(_with(with_drafter=KvOutcome(8192, "q8_0", "q8_0"), without_drafter=SAME), True,
                 "q8_0/q8_0 KV", id="kv-precision-drops"),
    pytest.param(_with(resident_bytes_with_drafter=25 << 30, free_vram_bytes=24 << 30), True,
                 "25600 MiB of GPU memory and 24576 MiB is free", id="residency"),
    pytest.param(_with(resident_bytes_with_drafter=25 << 30, free_vram_bytes=None), False, None,
                 id="no-gpu-no-residency-check"),
    pytest.param(_with(drafter_is_explicit=True, with_drafter=KvOutcome(4096, "f16", "f16"),
                       without_drafter=SAME), False, None, id="explicit-drafter-kept"),
    pytest.param(_with(broken=frozenset({("cpu-1", "/b/text/d.gguf")})), True,
                 "broke an earlier start", id="broken-left-out"),
    pytest.param(_with(broken=frozenset({("cpu-2", "/b/text/d.gguf")})), False, None,
                 id="broken-on-another-build-kept"),
])
def test_drafter_left_out(inputs: DrafterInputs, left_out: bool, why: str | None) -> None:
    decision = decide_drafter(inputs)
    assert decision.left_out is left_out
    if left_out:
        assert decision.drafter_path is None
        assert decision.spec_type is None
        assert why is not None
        assert any(why in r for r in decision.reasons), decision.reasons
    else:
        assert decision.drafter_path == "/b/text/d.gguf"


def test_broken_registry_remembers_per_build_and_file() -> None:
    registry = BrokenDrafters()
    registry.mark("cpu-1", "/b/text/d.gguf")
    assert decide_drafter(_with(broken=registry.snapshot())).left_out
    assert not decide_drafter(_with(build_key="cpu-9", broken=registry.snapshot())).left_out


@pytest.mark.parametrize(("spec", "slots"), [
    pytest.param("draft-mtp", 1, id="draft-mtp-one-slot"),
    pytest.param("draft-simple", 4, id="draft-simple-keeps-slots"),
])
def test_slots(spec: str, slots: int) -> None:
    decision = decide_drafter(_with(catalog_spec_type=spec, model_has_mtp=True))
    assert decision.slots == slots
