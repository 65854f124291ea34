"""Fit a plan to what the build accepts: fork-only KV cache types fall back (pure).

Every feature a plan wants and the build lacks is named in the same words, "not supported
by this build: FEATURE" (``NOT_SUPPORTED``), whether the planner substituted it or the
launch cannot be made (``build_support.py`` checks the whole launch).

A plan may ask for a cache type only a fork ships (``qjl1_256``, ``q4_polar``). On a build
whose ``--help`` does not list it, K falls back to ``q8_0`` and V to ``q4_0`` (the "Q8 K +
Q4 V" pair reference 001 gives as the upstream equivalent; docs/references.md), and a
structured warning records the change so the report shows it: never a silent substitution.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from harness.facts.build import Capabilities

#: The words every plan, skip and failure uses for a feature the build lacks.
NOT_SUPPORTED = "not supported by this build"
#: The ``PlanWarning.code`` of a feature the build lacks, substituted or not (the cache
#: types keep their own code, ``cache-type-fallback``, with the same words).
NOT_SUPPORTED_CODE = "not-supported"

FALLBACK_K = "q8_0"
FALLBACK_V = "q4_0"


@dataclass(frozen=True)
class PlanWarning:
    """A planning decision the report must show: a code, the field, and what changed."""

    code: str
    field: str
    wanted: str
    used: str
    message: str


def not_supported_reason(features: Iterable[str]) -> str:
    """``not supported by this build: --n-cpu-ffn`` (features joined by commas)."""
    return f"{NOT_SUPPORTED}: {', '.join(features)}"


@dataclass(frozen=True)
class CacheTypeChoice:
    cache_type_k: str
    cache_type_v: str
    warnings: tuple[PlanWarning, ...]


def fit_cache_types(cache_type_k: str, cache_type_v: str,
                    capabilities: Capabilities) -> CacheTypeChoice:
    warnings: list[PlanWarning] = []
    k = _fit("cache_type_k", cache_type_k, capabilities.cache_types_k, FALLBACK_K, warnings)
    v = _fit("cache_type_v", cache_type_v, capabilities.cache_types_v, FALLBACK_V, warnings)
    return CacheTypeChoice(k, v, tuple(warnings))


def _fit(field: str, wanted: str, accepted: tuple[str, ...], fallback: str,
         warnings: list[PlanWarning]) -> str:
    # An empty list means the build's help did not say: trust the plan rather than guess.
    if not accepted or wanted in accepted:
        return wanted
    used = fallback if fallback in accepted else accepted[0]
    flag = "--" + field.replace("_", "-")
    warnings.append(PlanWarning(
        code="cache-type-fallback", field=field, wanted=wanted, used=used,
        message=f"{not_supported_reason([f'{flag} {wanted}'])} (it accepts "
                f"{', '.join(accepted)}); using {used!r} instead",
    ))
    return used
