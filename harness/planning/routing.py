"""Which inference backend a launch goes to, and why (pure).

Ported behaviour (reference 000, docs/references.md): a catalog entry whose runtime class
is ``fused`` goes to the fused llama-cpp backend; a model with no catalog entry goes to
llama-cpp by default; an explicit override (``HARNESS_INFERENCE_BACKEND``, read by the
caller) wins over both and says so.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from harness.errors import ConfigError
from harness.facts.catalog import CatalogEntry, RuntimeClass

OVERRIDE_VARIABLE = "HARNESS_INFERENCE_BACKEND"
#: The override value that means "no override, decide from the catalog".
AUTO = "auto"


class InferenceBackend(enum.StrEnum):
    """Backends a plan can be dispatched to; the values are the override's words."""

    LLAMA_CPP = "llama-cpp"


class RouteReason(enum.StrEnum):
    CATALOG = "catalog"
    DEFAULT = "default"
    ENV_OVERRIDE = "env-override"


@dataclass(frozen=True)
class RouteDecision:
    backend: InferenceBackend
    #: True when the launch runs the fused pipeline (catalog entry + bundle + drafter).
    fused: bool
    reason: RouteReason
    detail: str


def decide_backend(catalog: CatalogEntry | None, override: str | None) -> RouteDecision:
    """Route a launch. ``override`` is the raw override value, or None when unset."""
    fused = catalog is not None and catalog.runtime_class is RuntimeClass.FUSED
    if override and override != AUTO:
        try:
            backend = InferenceBackend(override)
        except ValueError:
            allowed = ", ".join([AUTO, *(b.value for b in InferenceBackend)])
            raise ConfigError(
                f"{OVERRIDE_VARIABLE}={override!r} names no inference backend; "
                f"allowed values: {allowed}"
            ) from None
        return RouteDecision(backend, fused, RouteReason.ENV_OVERRIDE,
                             f"{OVERRIDE_VARIABLE}={override} chose {backend.value}")
    if catalog is not None:
        what = ("fused runtime class: the fused llama-cpp pipeline" if fused
                else f"runtime class {catalog.runtime_class.value!r}")
        return RouteDecision(InferenceBackend.LLAMA_CPP, fused, RouteReason.CATALOG,
                             f"catalog entry {catalog.id!r} has {what}")
    return RouteDecision(InferenceBackend.LLAMA_CPP, False, RouteReason.DEFAULT,
                         "no catalog entry: llama-cpp is the default backend")
