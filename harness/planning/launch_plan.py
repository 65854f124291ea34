"""The launch planner: facts in, a launch plan with a reason for every decision out (pure).

The caller gathers the facts (GGUF header, GPU, configs, build capabilities, the
``HARNESS_*`` environment) and passes them in; this module only decides, in order:
route → autotune (catalog defaults under card → bundle → call → env) → cache types the
build accepts → drafter → KV cache → offload (with the switches the build has) → the
whole launch against the build's ``--help``. Every field of the resulting ``LaunchSpec``
records the layer that set it.

What the build lacks is recorded two ways, for two readers. Each feature it lacks is a
``not-supported`` ``PlanWarning`` ("not supported by this build: --n-cpu-ffn", with the
substitute where there is one), so the report shows it beside the plan's other
decisions. What the launch still needs is also the field ``unsupported``, because code
acts on it: such a plan is never sent (``ensure_sendable``), and the suites skip the test
with those words, or fail it under ``--harness-require-features``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.errors import ConfigError, UnsupportedByBuildError
from harness.facts.build import Backend, Capabilities
from harness.facts.catalog import Bundle, CatalogEntry
from harness.facts.device_list import DeviceList
from harness.facts.gpu import ForkKvType, GpuConfig, GpuInfo, LazyMode, ServerSettings
from harness.facts.model_facts import ModelFacts
from harness.planning.autotune import ENV_PREFIX, TuneResult, autotune
from harness.planning.build_support import unavailable_offload_kinds, unsupported_features
from harness.planning.capability import (
    NOT_SUPPORTED_CODE,
    PlanWarning,
    fit_cache_types,
    not_supported_reason,
)
from harness.planning.device_step import device_budget, plan_device_step
from harness.planning.draft_sampling import sampling_left_out
from harness.planning.drafter import DrafterDecision, DrafterInputs, KvOutcome, decide_drafter
from harness.planning.fitting import FitInputs, max_context_at
from harness.planning.kv import AUTO_PARALLEL, KvPlan, kv_bytes_per_token, layout_from_facts
from harness.planning.kv_step import plan_kv_step
from harness.planning.launch import LaunchSpec, field_of_flag
from harness.planning.lazy_tensors import LazyPlan, plan_lazy
from harness.planning.multi_device import DevicePlan
from harness.planning.offload import OffloadKind, OffloadPlan, plan_offload
from harness.planning.offload_fields import offload_substitute, offload_switches
from harness.planning.release_rules import NotModelled, release_lacks
from harness.planning.rocm_env import RocmLaunchEnv
from harness.planning.routing import OVERRIDE_VARIABLE, RouteDecision, decide_backend
from harness.planning.tuned_layer import model_class
from harness.planning.vision import VisionPlan, plan_vision, vision_fields

#: Origins of fields the planner sets itself, beside autotune's card/bucket/bundle/call/env.
CATALOG = "catalog"
CAPABILITY = "capability-fallback"
DRAFTER = "drafter"
OFFLOAD = "offload"
VISION = "vision"
#: Without a GPU the moved weights' RAM budget is not what limits a plan.
_UNBOUNDED_RAM = 1 << 60


@dataclass(frozen=True)
class PlanRequest:
    """Every fact the planner needs, as plain values."""

    model_path: Path
    model: ModelFacts
    bundle: Bundle | None = None
    #: Facts of the drafter file the launch would use (the bundle's, or an explicit one).
    drafter_model: ModelFacts | None = None
    gpu: GpuInfo | None = None
    configs: tuple[GpuConfig, ...] = ()
    capabilities: Capabilities = field(default_factory=Capabilities)
    build_key: str = ""
    #: Per-call setting overrides (ServerSettings names: ctx_size, parallel, …).
    per_call: Mapping[str, object] = field(default_factory=dict)
    explicit_spec_type: str | None = None
    explicit_drafter: Path | None = None
    #: The ``HARNESS_*`` environment, read by the caller.
    environ: Mapping[str, str] = field(default_factory=dict)
    broken_drafters: frozenset[tuple[str, str]] = frozenset()
    fork_kv_types: tuple[ForkKvType, ...] = ()
    ram_budget_bytes: int | None = None
    #: The llama.cpp release of the build (``BuildInfo.release.number``): the KV model
    #: follows that release's rules (planning/release_rules.py). None: planned as the pin.
    release: int | None = None
    #: Offload kinds the plan is asked not to use (``harness tune``'s offload candidates).
    avoid_offload: frozenset[OffloadKind] = frozenset()
    #: The build's backend: the card's ``spec_by_backend`` entry for it applies.
    backend: Backend | None = None
    #: A vision projector (``--mmproj``), its file's bytes, and ``--no-mmproj-offload``.
    projector: Path | None = None
    projector_bytes: int = 0
    keep_projector_off_gpu: bool = False
    #: A ROCm build's launch environment (``harness.probes.rocm_launch``): the devices it
    #: has no code for hidden, its kernel packs routed. None for other builds.
    launch_env: RocmLaunchEnv | None = None
    #: Several devices to spread the model over (``--device-config``; RPC servers), in
    #: llama.cpp's device order; None: one GPU (``gpu``) or none.
    devices: DeviceList | None = None


@dataclass(frozen=True)
class LaunchPlan:
    route: RouteDecision
    spec: LaunchSpec
    catalog: CatalogEntry | None
    bundle_root: Path | None
    tune: TuneResult
    drafter: DrafterDecision
    kv: KvPlan | None
    offload: OffloadPlan | None
    #: LaunchSpec field → the layer that set it.
    origins: Mapping[str, str]
    reasons: tuple[str, ...]
    warnings: tuple[PlanWarning, ...]
    #: Features the launch sends that the build lacks, with no substitute: the plan is
    #: not sent (``ensure_sendable``). Empty for every plan a build can start.
    unsupported: tuple[str, ...] = ()
    #: The tensors the server reads lazily from the GGUF (``harness.planning.lazy_tensors``).
    lazy: LazyPlan | None = None
    #: The vision projector and its budget (``harness.planning.vision``).
    vision: VisionPlan | None = None
    #: Variables the server is launched (and its devices probed) with, beyond the
    #: runner's own: a ROCm build's launch environment.
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    #: Each device's share of a spread over several (``harness.planning.multi_device``).
    devices: DevicePlan | None = None

    @property
    def not_supported(self) -> tuple[str, ...]:
        """Every feature the plan wanted that the build lacks: substituted or not."""
        return tuple(w.wanted for w in self.warnings if w.code == NOT_SUPPORTED_CODE)

    def ensure_sendable(self) -> None:
        """Raise ``UnsupportedByBuildError`` when the build lacks what this plan needs, so
        that it is never sent. (A test resting on a feature the planner may substitute
        asks the build itself: ``build_support.ensure_offered``.)"""
        if self.unsupported:
            raise UnsupportedByBuildError(self.unsupported,
                                          not_supported_reason(self.unsupported))

    def to_argv(self, binary: str, host: str, port: int) -> list[str]:
        return self.spec.to_argv(binary, host, port)

    def to_json(self, binary: str = "llama-server") -> dict[str, Any]:
        """The plan as a user reads it: argv, each field's value and origin, KV, reasons."""
        return {
            "route": {"backend": self.route.backend.value, "fused": self.route.fused,
                      "reason": self.route.reason.value, "detail": self.route.detail},
            "tune": {"source": self.tune.source.value, "label": self.tune.label,
                     "headline": self.tune.headline},
            "fields": {name: {"value": _plain(getattr(self.spec, name)), "origin": origin}
                       for name, origin in self.origins.items()},
            "kv": _kv_json(self.kv),
            "offload": None if self.offload is None else {
                "kind": self.offload.kind.value, "n": self.offload.n,
                "gpu_layers": self.offload.gpu_layers, "reason": self.offload.reason,
                "wanted": self.offload.wanted.value if self.offload.wanted else None},
            "reasons": list(self.reasons),
            "warnings": [vars(w) for w in self.warnings],
            "unsupported": list(self.unsupported),
            "vision": None if self.vision is None else {
                "projector": str(self.vision.projector), "bytes": self.vision.projector_bytes,
                "on_gpu": self.vision.on_gpu, "reason": self.vision.reason},
            "lazy": None if self.lazy is None else {
                "tensors": list(self.lazy.tensors), "bytes": self.lazy.lazy_bytes,
                "reason": self.lazy.reason},
            "environment": dict(self.environment),
            "devices": None if self.devices is None else self.devices.to_json(),
            "argv": self.to_argv(binary, "127.0.0.1", 0),
        }


def plan_launch(request: PlanRequest) -> LaunchPlan:
    catalog = request.bundle.entry if request.bundle else None
    route = decide_backend(catalog, request.environ.get(OVERRIDE_VARIABLE))
    tune = autotune(request.gpu, request.configs, catalog.id if catalog else None,
                    request.per_call,
                    {k: v for k, v in request.environ.items() if k.startswith(ENV_PREFIX)},
                    model_class=None if catalog else model_class(request.model.architecture),
                    backend=request.backend)
    settings, origins = _layer_over_catalog(catalog, tune)
    warnings: list[PlanWarning] = []
    reasons: list[str] = [route.detail, *tune.reasons]
    if request.launch_env is not None:
        reasons.append(f"ROCm launch environment: {request.launch_env.describe()}")

    choice = fit_cache_types(settings.cache_type_k or "f16", settings.cache_type_v or "f16",
                             request.capabilities)
    for warning in choice.warnings:
        settings = settings.overlaid(ServerSettings.from_values(
            {warning.field: warning.used}))
        origins[warning.field] = CAPABILITY
        reasons.append(warning.message)
    warnings.extend(choice.warnings)

    lazy, vision = _beyond_the_weights(request, settings.lazy_mode, reasons)
    # The GPU share beyond the file: a projector placed there, less what is read lazily.
    resident_extra = (vision.gpu_bytes if vision else 0) - lazy.lazy_bytes
    drafter = _decide_drafter(request, catalog, settings, tune.config, resident_extra)
    reasons.extend(drafter.reasons)
    if left_out := sampling_left_out(settings.spec_draft_sampling, drafter.spec_type,
                                     request.capabilities):
        settings = dataclasses.replace(settings, spec_draft_sampling=None)
        origins.pop("spec_draft_sampling", None)
        reasons.append(left_out)
    if drafter.slots != (settings.parallel or AUTO_PARALLEL):
        settings = settings.overlaid(ServerSettings(parallel=drafter.slots))
        origins["parallel"] = DRAFTER

    kv = plan_kv_step(request.model, request.release, settings, request.fork_kv_types,
                      warnings)
    if kv is not None:
        reasons.append(kv.reason)

    launch: dict[str, Any] = vision_fields(vision, request.keep_projector_off_gpu)
    origins.update(dict.fromkeys(launch, VISION))
    if drafter.spec_type:
        launch["spec_type"] = drafter.spec_type
        origins["spec_type"] = DRAFTER
    if drafter.drafter_path:
        launch["drafter"] = Path(drafter.drafter_path)
        origins["drafter"] = DRAFTER
    offload = _plan_offload(request, kv, drafter, tune.config, reasons,
                            vision_gpu_bytes=vision.gpu_bytes if vision else 0)
    if offload is not None and offload.wanted is not None:
        warnings.append(offload_substitute(offload))
    if offload is not None:
        if offload.gpu_layers is not None:
            settings = settings.overlaid(ServerSettings(n_gpu_layers=offload.gpu_layers))
            origins["n_gpu_layers"] = OFFLOAD
        for name, value in offload_switches(offload).items():
            launch[name] = value
            origins[name] = OFFLOAD
    devices, settings = plan_device_step(request.model, request.devices, offload, kv,
                                         settings=settings, origins=origins, launch=launch,
                                         reasons=reasons)
    spec = LaunchSpec.from_settings(request.model_path, settings, **launch)
    unsupported = (unsupported_features(spec, request.capabilities)
                   + release_lacks(spec.spec_type, request.model.architecture,
                                   request.release))
    for feature in unsupported:
        warnings.append(PlanWarning(
            NOT_SUPPORTED_CODE, _field_of(feature), feature, "",
            f"{not_supported_reason([feature])}; no substitute keeps the launch's meaning, "
            "so it is not sent"))
    return LaunchPlan(
        route=route, spec=spec, catalog=catalog,
        bundle_root=request.bundle.root if request.bundle else None, tune=tune,
        drafter=drafter, kv=kv, offload=offload, lazy=lazy, vision=vision,
        origins=MappingProxyType(dict(sorted(origins.items()))),
        reasons=tuple(r for r in reasons if r), warnings=tuple(warnings),
        unsupported=unsupported,
        environment=request.launch_env.environment if request.launch_env else {},
        devices=devices,
    )


def _layer_over_catalog(catalog: CatalogEntry | None,
                        tune: TuneResult) -> tuple[ServerSettings, dict[str, str]]:
    """Catalog defaults sit under every autotune layer: the card, bundle, call and env win."""
    base = ServerSettings() if catalog is None else ServerSettings(
        ctx_size=catalog.context_length, cache_type_k=catalog.cache_type_k,
        cache_type_v=catalog.cache_type_v)
    origins = {name: CATALOG for name, _ in base.items()}
    origins.update({name: origin.value for name, origin in tune.origins.items()})
    return base.overlaid(tune.settings), origins


def _beyond_the_weights(request: PlanRequest, lazy_mode: LazyMode | None,
                        reasons: list[str]) -> tuple[LazyPlan, VisionPlan | None]:
    """What the plan reads lazily and the projector it loads, each reason appended."""
    lazy = plan_lazy(request.model.lazy_marked, lazy_mode, request.capabilities)
    if request.model.lazy_marked or lazy_mode:
        reasons.append(lazy.reason)
    vision = plan_vision(request.projector, request.projector_bytes,
                         gpu_planned=request.gpu is not None,
                         keep_off_gpu=request.keep_projector_off_gpu)
    if vision is not None:
        reasons.append(vision.reason)
    return lazy, vision


def _decide_drafter(request: PlanRequest, catalog: CatalogEntry | None,
                    settings: ServerSettings, config: GpuConfig | None,
                    resident_extra: int) -> DrafterDecision:
    explicit = request.explicit_drafter
    path = explicit or (request.bundle.drafter_path if request.bundle else None)
    slots = settings.parallel or AUTO_PARALLEL
    with_drafter = without = None
    resident = 0
    free: int | None = None
    per_token = _kv_bytes_per_token(request.model, request.release)
    if (request.gpu is not None and config is not None and settings.ctx_size
            and per_token is not None):
        # The drafter's weights take VRAM the target's KV could have had: fit the
        # context both ways and let the drafter decision compare them.
        drafter_bytes = request.drafter_model.file_size if request.drafter_model else 0
        fits = [max_context_at(_fit_inputs(request, config, d, per_token, resident_extra),
                               slots).ctx_size
                for d in (drafter_bytes, 0)]
        k, v = settings.cache_type_k or "f16", settings.cache_type_v or "f16"
        with_drafter = KvOutcome(min(settings.ctx_size, fits[0]), k, v)
        without = KvOutcome(min(settings.ctx_size, fits[1]), k, v)
        free = (request.gpu.vram_mib - config.reserved_headroom_mib) << 20
        # A tensor read lazily stays in the file, as the runtime's estimate deducts it; a
        # projector on the GPU is there beside the weights.
        resident = (request.model.file_size + resident_extra + drafter_bytes
                    + per_token * settings.ctx_size)
    by_backend = (config.spec_by_backend.get(request.backend)
                  if config is not None and request.backend is not None else None)
    return decide_drafter(DrafterInputs(
        explicit_spec_type=request.explicit_spec_type,
        card_spec_type=by_backend.spec_type if by_backend else None,
        card_name=config.name if config is not None else "",
        catalog_spec_type=catalog.spec_type if catalog else None,
        drafter_path=str(path) if path else None,
        drafter_is_explicit=explicit is not None,
        model_has_mtp=request.model.has_mtp_head,
        drafter_has_mtp=bool(request.drafter_model and request.drafter_model.has_mtp_head),
        build_key=request.build_key, broken=request.broken_drafters, slots=slots,
        with_drafter=with_drafter, without_drafter=without,
        resident_bytes_with_drafter=resident, free_vram_bytes=free,
    ))


def _kv_bytes_per_token(model: ModelFacts, release: int | None) -> int | None:
    try:
        return kv_bytes_per_token(layout_from_facts(model, release))
    except (ConfigError, NotModelled):
        return None  # an unmodelled layout: _plan_kv records the warning


def _fit_inputs(request: PlanRequest, config: GpuConfig, drafter_bytes: int,
                per_token: int, resident_extra: int) -> FitInputs:
    assert request.gpu is not None
    return FitInputs(
        vram_mib=request.gpu.vram_mib, reserved_headroom_mib=config.reserved_headroom_mib,
        weights_bytes=request.model.file_size + resident_extra, drafter_bytes=drafter_bytes,
        kv_bytes_per_token=per_token,
        max_parallel=config.fit_caps.max_parallel, max_ctx_size=config.fit_caps.max_ctx_size,
    )


def _plan_offload(request: PlanRequest, kv: KvPlan | None, drafter: DrafterDecision,
                  config: GpuConfig | None, reasons: list[str], *,
                  vision_gpu_bytes: int) -> OffloadPlan | None:
    context = kv.n_ctx if kv is not None and kv.valid else request.model.context_length
    budget = device_budget(request.gpu, config, request.devices, context)
    if budget is None:
        reasons.append("no GPU: weights and KV stay in system memory, no offload planning")
        return None
    # The runtime's additional GPU bytes: the vision budget plus the drafter's.
    drafter_bytes = vision_gpu_bytes + (request.drafter_model.file_size
                                        if request.drafter_model and drafter.drafter_path
                                        else 0)
    plan = plan_offload(
        request.model, budget.bytes, kv.total_bytes if kv and kv.valid else 0,
        request.ram_budget_bytes if request.ram_budget_bytes is not None else _UNBOUNDED_RAM,
        drafter_bytes, unavailable=unavailable_offload_kinds(request.capabilities),
        avoided=request.avoid_offload, compute_reserve_bytes=budget.compute_reserve_bytes,
        margin_bytes=budget.margin_bytes,
    )
    reasons.append(plan.reason)
    return plan


def _field_of(feature: str) -> str:
    """The ``LaunchSpec`` field a feature's flag sets, or the flag where none does."""
    flag = feature.partition(" ")[0]
    return field_of_flag(flag) or flag


def _kv_json(kv: KvPlan | None) -> dict[str, Any] | None:
    if kv is None:
        return None
    return {
        "valid": kv.valid, "refusal": kv.refusal, "n_ctx": kv.n_ctx, "n_ctx_seq": kv.n_ctx_seq,
        "cells": kv.cells, "k_bytes": kv.k_bytes, "v_bytes": kv.v_bytes,
        "caches": [{"role": c.role.value, "cells": c.cells, "layers": c.layers,
                    "type_k": c.type_k, "type_v": c.type_v, "k_bytes": c.k_bytes,
                    "v_bytes": c.v_bytes} for c in kv.caches],
    }


def _plain(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    return getattr(value, "value", value)
