"""Routing and the capability fallback (pure)."""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.facts.build import Capabilities
from harness.facts.catalog import CatalogEntry, RuntimeClass
from harness.planning.capability import fit_cache_types
from harness.planning.routing import InferenceBackend, RouteReason, decide_backend


def _entry(runtime_class: RuntimeClass = RuntimeClass.FUSED) -> CatalogEntry:
    return CatalogEntry(id="tiny-dense", runtime_class=runtime_class, context_length=2048,
                        cache_type_k="f16", cache_type_v="f16", drafter=None,
                        spec_type=None, tags=())


@pytest.mark.parametrize(("catalog", "override", "fused", "reason"), [
    pytest.param(_entry(), None, True, RouteReason.CATALOG, id="fused-catalog"),
    pytest.param(_entry(), "auto", True, RouteReason.CATALOG, id="fused-catalog-auto"),
    pytest.param(None, None, False, RouteReason.DEFAULT, id="no-catalog-default"),
    pytest.param(None, "", False, RouteReason.DEFAULT, id="empty-override-is-unset"),
    pytest.param(_entry(), "llama-cpp", True, RouteReason.ENV_OVERRIDE, id="override-wins"),
    pytest.param(None, "llama-cpp", False, RouteReason.ENV_OVERRIDE, id="override-no-catalog"),
])
def test_routing(catalog: CatalogEntry | None, override: str | None, fused: bool,
                 reason: RouteReason) -> None:
    decision = decide_backend(catalog, override)
    assert decision.backend is InferenceBackend.LLAMA_CPP
    assert decision.fused is fused
    assert decision.reason is reason
    assert decision.detail


def test_a_runtime_class_outside_the_catalog_format_is_refused() -> None:
    # Where a manifest's or bundle spec's text becomes an entry.
    with pytest.raises(ValueError, match=r"runtime_class 'plain' is not one of 'fused'"):
        _entry("plain")  # type: ignore[arg-type]
    assert _entry("fused").runtime_class is RuntimeClass.FUSED  # type: ignore[arg-type]
    assert _entry().to_json()["runtime_class"] == "fused"


def test_override_says_so() -> None:
    decision = decide_backend(_entry(), "llama-cpp")
    assert "HARNESS_INFERENCE_BACKEND=llama-cpp" in decision.detail


def test_unknown_override_names_the_variable_and_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        decide_backend(None, "vllm")
    assert "HARNESS_INFERENCE_BACKEND='vllm'" in str(info.value)
    assert "auto, llama-cpp" in str(info.value)


UPSTREAM = Capabilities(cache_types_k=("f32", "f16", "q8_0", "q4_0"),
                        cache_types_v=("f32", "f16", "q8_0", "q4_0"))
FORK = Capabilities(cache_types_k=("f16", "q8_0", "qjl1_256"),
                    cache_types_v=("f16", "q4_0", "q4_polar"))


@pytest.mark.parametrize(("caps", "k", "v", "want_k", "want_v", "warned"), [
    pytest.param(UPSTREAM, "f16", "f16", "f16", "f16", (), id="accepted-unchanged"),
    pytest.param(UPSTREAM, "qjl1_256", "q4_polar", "q8_0", "q4_0",
                 ("cache_type_k", "cache_type_v"), id="fork-types-on-upstream-fall-back"),
    pytest.param(FORK, "qjl1_256", "q4_polar", "qjl1_256", "q4_polar", (), id="fork-build-keeps"),
    pytest.param(UPSTREAM, "f16", "q4_polar", "f16", "q4_0", ("cache_type_v",), id="only-v"),
    pytest.param(Capabilities(), "qjl1_256", "f16", "qjl1_256", "f16", (),
                 id="unknown-capabilities-trust-the-plan"),
])
def test_cache_type_fallback(caps: Capabilities, k: str, v: str, want_k: str, want_v: str,
                             warned: tuple[str, ...]) -> None:
    choice = fit_cache_types(k, v, caps)
    assert (choice.cache_type_k, choice.cache_type_v) == (want_k, want_v)
    assert tuple(w.field for w in choice.warnings) == warned
    for warning in choice.warnings:
        assert warning.code == "cache-type-fallback"
        assert warning.wanted in warning.message
        assert warning.used in warning.message
