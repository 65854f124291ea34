"""Per-GPU autotune (pure): a detected GPU and the card configs in, llama-server settings out.

The card is chosen by device name; a GPU no config names falls back on a VRAM bucket that
borrows a tuned card's settings (reference 001's table, parallel scaling included;
docs/references.md); below the smallest bucket there is no config and the catalog's
defaults stand. Settings are layered, later wins:

    card defaults -> bundle recommendation -> (bucket parallel scaling)
    -> tuned (``harness tune --write``; matched cards only) -> per-call overrides
    -> environment overrides (HARNESS_LLAMA_*)

The result says which layer set every field, and why, so a fallback is logged loudly.
The caller reads ``os.environ`` and passes the mapping in: nothing here does I/O.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import (
    SETTING_FIELDS,
    SETTING_NAMES,
    SETTINGS_BY_NAME,
    FieldKind,
    GpuConfig,
    GpuInfo,
    ServerSettings,
    SettingField,
    SettingValue,
)
from harness.planning.tuned_layer import context_key, find_tuned, tuned_keys

#: Environment overrides are ``HARNESS_LLAMA_`` + the field name in capitals.
ENV_PREFIX = "HARNESS_LLAMA_"

#: A name match is trusted only when the GPU reports at least this share of the card's
#: VRAM: nvidia-smi/rocm-smi totals sit within a few percent of the nominal size, while a
#: MIG slice or a smaller variant sold under the same name (RTX 4090 Laptop, Arc A770
#: 8 GB) reports far less and is better served by its VRAM bucket.
MATCH_MIN_VRAM_SHARE = 0.9

_TRUE = frozenset({"1", "true", "on", "yes"})
_FALSE = frozenset({"0", "false", "off", "no"})


class TuneSource(enum.StrEnum):
    """How the config was chosen."""

    MATCH = "match"
    BUCKET = "bucket"
    NONE = "none"


class Origin(enum.StrEnum):
    """The layer that set a field."""

    CARD = "card"
    #: The card's ``spec_by_backend`` entry for the build's backend.
    CARD_BACKEND = "card-backend"
    BUCKET = "bucket"
    BUNDLE = "bundle"
    TUNED = "tuned"
    CALL = "call"
    ENV = "env"


@dataclass(frozen=True)
class VramBucket:
    """GPUs with ``min_gib <= VRAM < max_gib`` borrow ``config_name``'s settings."""

    label: str
    min_gib: float
    max_gib: float | None
    config_name: str | None
    parallel_scale: float = 1.0

    def holds(self, vram_mib: int) -> bool:
        gib = vram_mib / 1024
        return gib >= self.min_gib and (self.max_gib is None or gib < self.max_gib)

    def describe(self) -> str:
        upper = f"{_num(self.max_gib)} GiB" if self.max_gib is not None else "up"
        return f"{self.label!r} ({_num(self.min_gib)}-{upper})"


#: Reference 001's fallback table. Ranges are half-open, lower bound included, as the
#: table's "< 12 | 12-18 | ..." reads; "mid-plus" is the 5090 profile capped by halving
#: its slots.
VRAM_BUCKETS: tuple[VramBucket, ...] = (
    VramBucket("tiny", 0, 12, None),
    VramBucket("small", 12, 18, "rtx-3090", parallel_scale=0.5),
    VramBucket("mid", 18, 28, "rtx-3090"),
    VramBucket("mid-plus", 28, 40, "rtx-5090", parallel_scale=0.5),
    VramBucket("large", 40, 80, "rtx-5090"),
    VramBucket("huge", 80, None, "h200"),
)


@dataclass(frozen=True)
class TuneResult:
    """The settings autotune chose, where each came from, and why."""

    settings: ServerSettings
    source: TuneSource
    #: The matched config's name, or the bucket's label; None when no GPU was seen.
    label: str | None
    #: The config whose values were used (matched or borrowed by the bucket).
    config: GpuConfig | None
    bucket: VramBucket | None
    #: The ``bundle_recommendations`` key applied, if any.
    bundle_key: str | None
    origins: Mapping[str, Origin]
    reasons: tuple[str, ...]

    @property
    def headline(self) -> str:
        """The one line to log; a bucket fallback says plainly it is not a tuned profile."""
        return self.reasons[0]


def autotune(
    gpu: GpuInfo | None,
    configs: Sequence[GpuConfig],
    bundle_id: str | None,
    per_call: Mapping[str, object],
    env_overrides: Mapping[str, str],
    *,
    model_class: str | None = None,
    backend: Backend | None = None,
) -> TuneResult:
    """Resolve the llama-server settings for ``gpu`` and ``bundle_id``.

    ``per_call`` holds field names (``SETTING_NAMES``) to values, ``None`` meaning
    "no override"; ``env_overrides`` is the environment (other variables are ignored).
    ``model_class``: a bare model's key for the card's ``tuned`` entries
    (planning/tuned_layer.py), None for a bundle. ``backend``: the build's, whose
    ``spec_by_backend`` entry of the card lies over the card's speculative settings.
    Bad values raise ``ConfigError`` naming the field or variable and what is allowed.
    """
    call = call_overrides(per_call)
    env = env_settings(env_overrides)
    source, config, bucket, reasons = _select(gpu, configs)
    settings = ServerSettings()
    origins: dict[str, Origin] = {}
    bundle_key: str | None = None

    if config is not None:
        base = Origin.CARD if source is TuneSource.MATCH else Origin.BUCKET
        settings = _layer(settings, config.llama_server_flags, base, origins)
        by_backend = config.spec_by_backend.get(backend) if backend is not None else None
        if by_backend is not None and by_backend.settings.as_dict():
            settings = _layer(settings, by_backend.settings, Origin.CARD_BACKEND, origins)
            reasons.append(f"{config.name} for {backend} builds sets "
                           f"{_show(by_backend.settings)}")
        bundle_key = bundle_key_for(config, bundle_id)
        if bundle_key is not None:
            rec = config.bundle_recommendations[bundle_key]
            settings = _layer(settings, rec, Origin.BUNDLE, origins)
            reasons.append(f"bundle {bundle_id!r}: {config.name} recommendation "
                           f"{bundle_key!r} sets {_show(rec)}")
        elif bundle_id is not None:
            reasons.append(f"bundle {bundle_id!r}: {config.name} has no recommendation for "
                           "it; card defaults stand")
        if bucket is not None and bucket.parallel_scale != 1.0 and settings.parallel:
            scaled = max(1, math.floor(settings.parallel * bucket.parallel_scale))
            reasons.append(f"bucket {bucket.label!r} scales parallel {settings.parallel} "
                           f"x{_num(bucket.parallel_scale)} -> {scaled}")
            settings = replace(settings, parallel=scaled)
            origins["parallel"] = Origin.BUCKET
        if source is TuneSource.MATCH:
            # Measured on this card only: a bucket's borrowed card is another card.
            ctx = env.ctx_size or call.ctx_size or settings.ctx_size
            found = find_tuned(config, tuned_keys(bundle_id, bundle_key, model_class), ctx)
            if found is not None:
                key, tuned = found
                settings = _layer(settings, tuned.settings, Origin.TUNED, origins)
                reasons.append(f"tuned {key!r} at context {context_key(ctx)}: "
                               f"{tuned.candidate}, measured {tuned.measured} on build "
                               f"{tuned.build_key}, sets {_show(tuned.settings)}")
    if call.as_dict():
        settings = _layer(settings, call, Origin.CALL, origins)
        reasons.append(f"per-call overrides set {_show(call)}")
    if env.as_dict():
        settings = _layer(settings, env, Origin.ENV, origins)
        reasons.append("environment overrides set " + ", ".join(
            f"{ENV_PREFIX}{name.upper()} -> {name}={_plain(value)}"
            for name, value in env.items()))
    label = config.name if source is TuneSource.MATCH and config is not None else (
        bucket.label if bucket is not None else None)
    return TuneResult(
        settings=settings, source=source, label=label, config=config, bucket=bucket,
        bundle_key=bundle_key,
        origins=MappingProxyType({n: origins[n] for n in SETTING_NAMES if n in origins}),
        reasons=tuple(reasons),
    )


def bucket_for(vram_mib: int) -> VramBucket:
    """The VRAM bucket holding ``vram_mib`` (the buckets cover every size >= 0)."""
    for bucket in VRAM_BUCKETS:
        if bucket.holds(vram_mib):
            return bucket
    raise ConfigError(f"GPU memory {vram_mib} MiB is not allowed; allowed: >= 0 MiB")


def match_config(name: str, configs: Sequence[GpuConfig]) -> GpuConfig | None:
    """The config whose ``match`` pattern finds the longest text in ``name``.

    Patterns are case-insensitive regular expressions searched anywhere in the name;
    the longest hit is the most specific, and the config name breaks ties.
    """
    best: tuple[int, str, GpuConfig] | None = None
    for config in configs:
        for pattern in config.match:
            hit = re.search(pattern, name, flags=re.IGNORECASE)
            if hit is None:
                continue
            key = (-len(hit.group(0)), config.name, config)
            if best is None or key[:2] < best[:2]:
                best = key
    return None if best is None else best[2]


def bundle_key_for(config: GpuConfig, bundle_id: str | None) -> str | None:
    """The recommendation for ``bundle_id``: its exact id, else the longest bundle class.

    A class is an id prefix ending at a dash: ``eliza-1-9b`` covers ``eliza-1-9b-256k``.
    """
    if bundle_id is None:
        return None
    wanted = bundle_id.lower()
    if wanted in config.bundle_recommendations:
        return wanted
    classes = [key for key in config.bundle_recommendations if wanted.startswith(key + "-")]
    return max(classes, key=len) if classes else None


def call_overrides(per_call: Mapping[str, object]) -> ServerSettings:
    """Per-call overrides checked against each field's domain; ``None`` means unset."""
    values: dict[str, SettingValue] = {}
    for name, value in per_call.items():
        spec = SETTINGS_BY_NAME.get(name)
        if spec is None:
            raise ConfigError(
                f"per-call override {name!r} is not a setting; allowed: "
                + ", ".join(sorted(SETTINGS_BY_NAME))
            )
        if value is None:
            continue
        checked = _check_value(spec, value)
        if checked is None:
            raise ConfigError(
                f"per-call override {name!r}: {value!r} is not allowed; allowed: "
                f"{spec.allowed()}"
            )
        values[name] = checked
    return ServerSettings.from_values(values)


def env_settings(environ: Mapping[str, str]) -> ServerSettings:
    """``HARNESS_LLAMA_*`` variables parsed into settings; an empty value means unset."""
    allowed = {ENV_PREFIX + f.name.upper(): f for f in SETTING_FIELDS}
    values: dict[str, SettingValue] = {}
    for variable in sorted(environ):
        if not variable.startswith(ENV_PREFIX):
            continue
        spec = allowed.get(variable)
        if spec is None:
            raise ConfigError(
                f"environment variable {variable} is not a llama-server setting the harness "
                "knows; allowed: " + ", ".join(sorted(allowed))
            )
        text = environ[variable].strip()
        if not text:
            continue
        parsed = _parse_text(spec, text)
        if parsed is None:
            raise ConfigError(
                f"environment variable {variable}={environ[variable]!r} is not allowed; "
                f"allowed: {spec.allowed()}"
            )
        values[spec.name] = parsed
    return ServerSettings.from_values(values)


# --- internals ------------------------------------------------------------------------


def _select(
    gpu: GpuInfo | None, configs: Sequence[GpuConfig]
) -> tuple[TuneSource, GpuConfig | None, VramBucket | None, list[str]]:
    if gpu is None:
        return TuneSource.NONE, None, None, [
            "autotune: no GPU detected; no GPU config applies, catalog defaults stand"]
    seen = f"{gpu.name!r} ({gpu.vram_mib} MiB)"
    matched = match_config(gpu.name, configs)
    notes: list[str] = []
    if matched is not None:
        floor = int(matched.vram_mib * MATCH_MIN_VRAM_SHARE)
        if gpu.vram_mib >= floor:
            reasons = [f"autotune: {seen} matched GPU config {matched.name!r}"]
            if gpu.backend is not None and gpu.backend not in matched.backends:
                reasons.append(f"note: backend {gpu.backend.value!r} is not among "
                               f"{matched.name}'s backends "
                               f"({', '.join(b.value for b in matched.backends)})")
            return TuneSource.MATCH, matched, None, reasons
        notes.append(f"the name matches {matched.name!r} but {gpu.vram_mib} MiB is under "
                     f"{floor} MiB ({_num(MATCH_MIN_VRAM_SHARE * 100)}% of its "
                     f"{_num(matched.vram_gib)} GiB): a MIG slice or a smaller variant, so "
                     "the VRAM bucket decides")
    bucket = bucket_for(gpu.vram_mib)
    if bucket.config_name is None:
        return TuneSource.NONE, None, bucket, [
            f"autotune: NO GPU config for {seen}: below the smallest VRAM bucket "
            f"(bucket {bucket.describe()}); catalog defaults stand", *notes]
    by_name = {c.name: c for c in configs}
    config = by_name.get(bucket.config_name)
    if config is None:
        raise ConfigError(
            f"VRAM bucket {bucket.label!r} falls back on GPU config {bucket.config_name!r}, "
            "which is not among the loaded configs; allowed: "
            + (", ".join(sorted(by_name)) or "(none loaded)")
        )
    scale = (f", parallel x{_num(bucket.parallel_scale)}"
             if bucket.parallel_scale != 1.0 else "")
    return TuneSource.BUCKET, config, bucket, [
        f"autotune: NO tuned GPU config for {seen}; falling back on VRAM bucket "
        f"{bucket.describe()} -> {config.name} settings{scale}. This is not a tuned "
        "profile: add a config to configs/gpu/ for this card", *notes]


def _layer(
    settings: ServerSettings, layer: ServerSettings, origin: Origin,
    origins: dict[str, Origin],
) -> ServerSettings:
    for name, _ in layer.items():
        origins[name] = origin
    return settings.overlaid(layer)


def _check_value(spec: SettingField, value: object) -> SettingValue | None:
    """``value`` if it lies in the field's domain, else None (bools are never numbers)."""
    if spec.kind is FieldKind.BOOL:
        return value if isinstance(value, bool) else None
    if spec.kind is FieldKind.CHOICE:
        return value if isinstance(value, str) and value in spec.choices else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if spec.kind is FieldKind.INT and not isinstance(value, int):
        return None
    if not math.isfinite(value):
        return None
    if spec.minimum is not None and value < spec.minimum:
        return None
    if spec.maximum is not None and value > spec.maximum:
        return None
    if spec.multiple_of is not None and int(value) % spec.multiple_of:
        return None
    return float(value) if spec.kind is FieldKind.FLOAT else value


def _parse_text(spec: SettingField, text: str) -> SettingValue | None:
    if spec.kind is FieldKind.BOOL:
        word = text.lower()
        return True if word in _TRUE else False if word in _FALSE else None
    if spec.kind is FieldKind.CHOICE:
        return _check_value(spec, text.lower())
    try:
        number: int | float = int(text) if spec.kind is FieldKind.INT else float(text)
    except ValueError:
        return None
    return _check_value(spec, number)


def _show(settings: ServerSettings) -> str:
    return ", ".join(f"{name}={_plain(value)}" for name, value in settings.items())


def _plain(value: SettingValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
