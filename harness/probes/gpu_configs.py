"""Loading the per-GPU configs (configs/gpu/*.json) and the fork KV types
(configs/gpu/kv_types.json).

Each file is validated against its JSON schema (draft 2020-12) through harness/data_schema,
and every problem is reported at once: the file, the JSON path
(``$.llama_server_flags.parallel``), the value found and what the schema allows there.
Checks a schema cannot state (the name matches the file, ubatch <= batch, settings within
the card's fit caps) follow, in the same words.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.data_schema import fail_if_any, join_path, load_json, problem
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import (
    SETTINGS_BY_NAME,
    BackendSpec,
    ExpectedMetrics,
    FieldKind,
    FitCaps,
    ForkKvType,
    GpuConfig,
    MeasuredDecode,
    Provenance,
    ServerSettings,
    SettingValue,
    Supports,
    TunedSettings,
    Vendor,
)
from harness.resources import card_path

GPU_CONFIG_DIR = card_path("configs/gpu")
GPU_SCHEMA_NAME = "schema.json"
KV_TYPES_PATH = GPU_CONFIG_DIR / "kv_types.json"
KV_TYPES_SCHEMA_PATH = GPU_CONFIG_DIR / "kv_types.schema.json"
#: The files beside the cards in their folder that are not cards.
NOT_CARDS = frozenset({GPU_SCHEMA_NAME, KV_TYPES_PATH.name, KV_TYPES_SCHEMA_PATH.name,
                       "kv_quality.json", "kv_quality.schema.json"})


def load_gpu_configs(directory: Path | None = None) -> tuple[GpuConfig, ...]:
    """Every ``*.json`` card config in ``directory`` (not the schema or the KV types), by name."""
    directory = GPU_CONFIG_DIR if directory is None else directory
    schema_path = directory / GPU_SCHEMA_NAME
    if not schema_path.is_file():
        # A directory of test configs may carry no schema of its own.
        schema_path = GPU_CONFIG_DIR / GPU_SCHEMA_NAME
    paths = sorted(p for p in directory.glob("*.json") if p.name not in NOT_CARDS)
    if not paths:
        raise ConfigError(f"{directory}: no GPU config files (*.json) found")
    return tuple(_load_gpu_config(path, schema_path) for path in paths)


def load_fork_kv_types(path: Path | None = None) -> tuple[ForkKvType, ...]:
    """The fork-only KV cache types, in file order; names must be unique."""
    path = KV_TYPES_PATH if path is None else path
    obj = load_json(path, KV_TYPES_SCHEMA_PATH, ConfigError)
    types: list[ForkKvType] = []
    duplicates: list[str] = []
    for index, item in enumerate(obj["types"]):
        name = str(item["name"])
        if any(t.name == name for t in types):
            duplicates.append(problem(path, f"$.types[{index}].name", name, "a duplicate",
                                      "a name no other entry uses"))
        types.append(ForkKvType(name=name, block_size=int(item["block_size"]),
                                bytes_per_block=int(item["bytes_per_block"])))
    fail_if_any(ConfigError, duplicates)
    return tuple(types)


# --- from validated JSON to facts -----------------------------------------------------


def _load_gpu_config(path: Path, schema_path: Path) -> GpuConfig:
    obj = load_json(path, schema_path, ConfigError)
    flags = _settings(obj["llama_server_flags"])
    caps = obj["fit_caps"]
    metrics = obj["expected_metrics"]
    config = GpuConfig(
        name=obj["name"],
        match=tuple(obj["match"]),
        vendor=Vendor(obj["vendor"]),
        backends=tuple(Backend(b) for b in obj["backends"]),
        vram_gib=float(obj["vram_gib"]),
        compute_capability=obj.get("compute_capability"),
        gfx_target=obj.get("gfx_target"),
        architecture=obj["architecture"],
        memory_bandwidth_gbps=float(obj["memory_bandwidth_gbps"]),
        supports=Supports(**{k: bool(v) for k, v in obj["supports"].items()}),
        reserved_headroom_mib=int(obj["reserved_headroom_mib"]),
        fit_caps=FitCaps(max_parallel=int(caps["max_parallel"]),
                         max_ctx_size=int(caps["max_ctx_size"])),
        llama_server_flags=flags,
        bundle_recommendations=MappingProxyType(
            {key: _settings(value) for key, value in obj["bundle_recommendations"].items()}
        ),
        expected_metrics=ExpectedMetrics(
            ttfa_p50_ms=float(metrics["ttfa_p50_ms"]),
            ttfa_p95_ms=float(metrics["ttfa_p95_ms"]),
            rtf=float(metrics["rtf"]),
            tokens_per_second_decode=_opt_float(metrics.get("tokens_per_second_decode")),
            provenance=Provenance(metrics["_provenance"]),
            note=metrics.get("_note"),
        ),
        known_limits=tuple(obj["known_limits"]),
        description=obj.get("description"),
        measured_decode=MappingProxyType({
            (bundle, label): MeasuredDecode(median=float(entry["decode_tps"]["median"]),
                                            spread=float(entry["decode_tps"]["spread"]),
                                            runs=int(entry["runs"]), last=entry["last"])
            for bundle, keys in obj.get("measured", {}).items()
            for label, entry in keys.items() if "decode_tps" in entry}),
        tuned=MappingProxyType({
            (key, ctx): TunedSettings(settings=_settings(entry["settings"]),
                                      measured=entry["provenance"]["measured"],
                                      build_key=entry["provenance"]["build_key"],
                                      candidate=entry["provenance"]["candidate"])
            for key, contexts in obj.get("tuned", {}).items()
            for ctx, entry in contexts.items()}),
        spec_by_backend=MappingProxyType({
            Backend(name): BackendSpec(
                spec_type=entry.get("spec_type"),
                settings=_settings({k: v for k, v in entry.items() if k != "spec_type"}))
            for name, entry in obj.get("spec_by_backend", {}).items()}),
        source=str(path),
    )
    _check_consistency(path, config)
    return config


def _settings(values: Mapping[str, Any]) -> ServerSettings:
    """Schema-valid settings as typed values (JSON integers may arrive as 2.0)."""
    typed: dict[str, SettingValue] = {}
    for name, raw in values.items():
        spec = SETTINGS_BY_NAME[name]
        if spec.kind is FieldKind.INT:
            typed[name] = int(raw)
        elif spec.kind is FieldKind.FLOAT:
            typed[name] = float(raw)
        else:
            typed[name] = raw
    return ServerSettings.from_values(typed)


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


def _check_consistency(path: Path, config: GpuConfig) -> None:
    """What the schema cannot say: cross-field rules on the card, each bundle and each
    tuned entry.

    A bundle is checked as the card's settings with its own on top, and blamed only for
    rules touching a field it sets (a card-level problem is reported once, on the card).
    """
    if config.name != path.stem:
        fail_if_any(ConfigError, [problem(
            path, "$.name", config.name, "it names another file",
            f"{json.dumps(path.stem)} (the file name without .json)")])
    card = config.llama_server_flags
    problems = [f"{path}: $.llama_server_flags.{text}"
                for _, text in _settings_problems(card, config.fit_caps)]
    for key, rec in config.bundle_recommendations.items():
        own = set(rec.as_dict())
        where = join_path("$.bundle_recommendations", key)
        problems += [f"{path}: {where}.{text}"
                     for involved, text in _settings_problems(card.overlaid(rec), config.fit_caps)
                     if own & involved]
    for backend, spec in config.spec_by_backend.items():
        where = f"$.spec_by_backend.{backend.value}"
        if backend not in (*config.backends, Backend.CPU):
            problems.append(problem(path, where, backend.value, "not one of the card's backends",
                                    ", ".join(b.value for b in config.backends) + " or cpu"))
        own = set(spec.settings.as_dict())
        problems += [f"{path}: {where}.{text}"
                     for involved, text in _settings_problems(card.overlaid(spec.settings),
                                                              config.fit_caps)
                     if own & involved]
    for (key, ctx), tuned in config.tuned.items():
        own = set(tuned.settings.as_dict())
        where = join_path(join_path("$.tuned", key), ctx) + ".settings"
        base = card.overlaid(config.bundle_recommendations.get(key, ServerSettings()))
        problems += [f"{path}: {where}.{text}"
                     for involved, text in _settings_problems(base.overlaid(tuned.settings),
                                                              config.fit_caps)
                     if own & involved]
    fail_if_any(ConfigError, problems)


def _settings_problems(
    settings: ServerSettings, caps: FitCaps,
) -> Iterable[tuple[set[str], str]]:
    """(the fields a broken rule involves, the message from the first field on)."""
    batch, ubatch = settings.batch_size, settings.ubatch_size
    if batch is not None and ubatch is not None and ubatch > batch:
        yield {"batch_size", "ubatch_size"}, (
            f"ubatch_size: {ubatch} is not allowed: larger than batch_size {batch}; "
            f"allowed: <= {batch}")
    low, high = settings.spec_draft_n_min, settings.spec_draft_n_max
    if low is not None and high is not None and low > high:
        yield {"spec_draft_n_min", "spec_draft_n_max"}, (
            f"spec_draft_n_min: {low} is not allowed: larger than spec_draft_n_max {high}; "
            f"allowed: <= {high}")
    if settings.parallel is not None and settings.parallel > caps.max_parallel:
        yield {"parallel"}, (
            f"parallel: {settings.parallel} is not allowed: above the card's "
            f"fit_caps.max_parallel; allowed: <= {caps.max_parallel}")
    if settings.ctx_size is not None and settings.parallel is not None:
        per_slot = settings.ctx_size // settings.parallel
        if per_slot > caps.max_ctx_size:
            yield {"ctx_size", "parallel"}, (
                f"ctx_size: {settings.ctx_size} is not allowed: {per_slot} tokens per slot "
                f"is above the card's fit_caps.max_ctx_size; allowed: <= "
                f"{caps.max_ctx_size * settings.parallel} with {settings.parallel} slots")
