"""Loading the per-GPU configs (configs/gpu/*.json) and the fork KV types (configs/kv_types.json).

Each file is validated against its JSON schema (draft 2020-12) and every problem is
reported at once: the file, the JSON path (``$.llama_server_flags.parallel``), the
value found and what the schema allows there. Checks a schema cannot state (the name
matches the file, ubatch <= batch, settings within the card's fit caps) follow.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import Any, cast

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError, ValidationError

from harness import strictjson
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import (
    SETTINGS_BY_NAME,
    ExpectedMetrics,
    FieldKind,
    FitCaps,
    ForkKvType,
    GpuConfig,
    Provenance,
    ServerSettings,
    SettingValue,
    Supports,
    Vendor,
)
from harness.paths import REPO_ROOT

GPU_CONFIG_DIR = REPO_ROOT / "configs" / "gpu"
GPU_SCHEMA_NAME = "schema.json"
KV_TYPES_PATH = REPO_ROOT / "configs" / "kv_types.json"
KV_TYPES_SCHEMA_PATH = REPO_ROOT / "configs" / "kv_types.schema.json"

_MAX_VALUE_CHARS = 80
#: Keys jsonschema writes as ``.key`` in a JSON path; others become ``['key']``.
_PLAIN_KEY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")


def load_gpu_configs(directory: Path | None = None) -> tuple[GpuConfig, ...]:
    """Every ``*.json`` card config in ``directory`` (except the schema), sorted by name."""
    directory = GPU_CONFIG_DIR if directory is None else directory
    schema_path = directory / GPU_SCHEMA_NAME
    if not schema_path.is_file():
        # A directory of test configs may carry no schema of its own.
        schema_path = GPU_CONFIG_DIR / GPU_SCHEMA_NAME
    validator = _validator(schema_path)
    paths = sorted(p for p in directory.glob("*.json") if p.name != GPU_SCHEMA_NAME)
    if not paths:
        raise ConfigError(f"{directory}: no GPU config files (*.json) found")
    return tuple(_load_gpu_config(path, validator) for path in paths)


def load_fork_kv_types(path: Path | None = None) -> tuple[ForkKvType, ...]:
    """The fork-only KV cache types, in file order; names must be unique."""
    path = KV_TYPES_PATH if path is None else path
    obj = strictjson.read_object(path, error=ConfigError)
    _raise_on_errors(path, _validator(KV_TYPES_SCHEMA_PATH), obj)
    types: list[ForkKvType] = []
    for index, item in enumerate(obj["types"]):
        name = str(item["name"])
        if any(t.name == name for t in types):
            raise ConfigError(
                f"{path}: $.types[{index}].name: {name!r} is not allowed: a duplicate; "
                "allowed: a name no other entry uses"
            )
        types.append(ForkKvType(name=name, block_size=int(item["block_size"]),
                                bytes_per_block=int(item["bytes_per_block"])))
    return tuple(types)


# --- schema validation and its messages ------------------------------------------------


def _validator(schema_path: Path) -> Draft202012Validator:
    schema = strictjson.read_object(schema_path, error=ConfigError)
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        raise ConfigError(f"{schema_path}: not a valid JSON schema: {exc.message}") from exc
    # The format checker makes "format": "regex" reject a pattern re cannot compile.
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _raise_on_errors(path: Path, validator: Draft202012Validator, obj: Any) -> None:
    root = cast(Mapping[str, Any], validator.schema)
    lines: list[str] = []
    for error in sorted(validator.iter_errors(obj), key=lambda e: (e.json_path, e.message)):
        for line in _messages(path, root, error):
            if line not in lines:
                lines.append(line)
    if lines:
        raise ConfigError("\n".join(lines))


def _messages(path: Path, root: Mapping[str, Any], error: ValidationError) -> list[str]:
    """One line per problem: file, JSON path, value, and what is allowed."""
    where = error.json_path
    schema = cast(Mapping[str, Any], error.schema)
    # jsonschema types these as "maybe unset"; on an error from iter_errors they are set.
    instance: Any = error.instance
    constraint: Any = error.validator_value
    rule = _rule(root, error)
    if error.validator == "additionalProperties":
        known = sorted(_properties(root, schema))
        extra = [k for k in instance if k not in known]
        return [f"{path}: {_join(where, key)}: unknown key (value {_show(instance[key])}) "
                f"is not allowed; allowed keys: {', '.join(known)}" for key in extra]
    if error.validator == "required":
        missing = [k for k in constraint if k not in instance]
        props = _properties(root, schema)
        return [f"{path}: {_join(where, key)}: missing required key; allowed: "
                f"{_describe(props.get(key, {}), root) or 'any value'}{rule}" for key in missing]
    if "propertyNames" in error.schema_path:
        return [f"{path}: {where}: key {_show(instance)} is not allowed: {error.message}; "
                f"allowed: keys {_describe(schema, root)}{rule}"]
    if error.validator == "not":
        forbidden = _required_in(constraint)
        present = [k for k in forbidden if isinstance(instance, Mapping)
                   and k in instance]
        return [f"{path}: {_join(where, key)}: {_show(instance[key])} is not allowed; "
                f"allowed: no {key!r} key{rule}" for key in present] or [
                f"{path}: {where}: not allowed here{rule}"]
    return [f"{path}: {where}: {_show(instance)} is not allowed: {error.message}; "
            f"allowed: {_describe(schema, root)}{rule}"]


def _rule(root: Mapping[str, Any], error: ValidationError) -> str:
    """The description of the ``allOf``/``then`` branch an error came from, if any."""
    parts = list(error.schema_path)
    if len(parts) >= 3 and parts[0] == "allOf" and parts[2] == "then":
        branch = root["allOf"][parts[1]]["then"]
        if "description" in branch:
            return f" ({branch['description']})"
    return ""


def _properties(root: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``properties`` a (sub)schema declares, following a local ``$ref``."""
    if "properties" in schema:
        props: Mapping[str, Any] = schema["properties"]
        return props
    if "$ref" in schema:
        return _properties(root, _resolve(root, schema["$ref"]))
    return {}


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    node: Any = root
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    resolved: Mapping[str, Any] = node
    return resolved


def _required_in(schema: Any) -> list[str]:
    """Keys a ``not`` subschema forbids: its ``required`` lists, also inside ``anyOf``."""
    keys: list[str] = list(schema.get("required", []))
    for branch in schema.get("anyOf", []):
        keys += _required_in(branch)
    return keys


def _describe(schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    """The constraints a subschema states, in words."""
    if "$ref" in schema:
        schema = {**_resolve(root, schema["$ref"]), **{k: v for k, v in schema.items()
                                                        if k != "$ref"}}
    words: list[str] = []
    if "const" in schema:
        words.append(f"exactly {json.dumps(schema['const'])}")
    if "enum" in schema:
        words.append("one of " + ", ".join(json.dumps(v) for v in schema["enum"]))
    if "type" in schema:
        words.append(f"type {schema['type']}")
    bounds = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
              ("exclusiveMaximum", "<"), ("multipleOf", "a multiple of"),
              ("minLength", "length >="), ("minItems", "items >="),
              ("minProperties", "keys >="))
    words += [f"{word} {schema[key]}" for key, word in bounds if key in schema]
    if "pattern" in schema:
        words.append(f"matching /{schema['pattern']}/")
    if schema.get("uniqueItems"):
        words.append("no repeated items")
    if "format" in schema:
        words.append(f"a valid {schema['format']}")
    if "items" in schema and isinstance(schema["items"], Mapping):
        inner = _describe(schema["items"], root)
        if inner:
            words.append(f"items: {inner}")
    if "propertyNames" in schema:
        words.append(_describe(schema["propertyNames"], root))
    return ", ".join(w for w in words if w)


def _join(where: str, key: str) -> str:
    """``where`` and one more key, spelled as jsonschema's ``json_path`` spells keys."""
    if _PLAIN_KEY.match(key):
        return f"{where}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{where}['{escaped}']"


def _show(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


# --- from validated JSON to facts -----------------------------------------------------


def _load_gpu_config(path: Path, validator: Draft202012Validator) -> GpuConfig:
    obj = strictjson.read_object(path, error=ConfigError)
    _raise_on_errors(path, validator, obj)
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
    """What the schema cannot say: cross-field rules on the card and each bundle.

    A bundle is checked as the card's settings with its own on top, and blamed only for
    rules touching a field it sets (a card-level problem is reported once, on the card).
    """
    if config.name != path.stem:
        raise ConfigError(
            f"{path}: $.name: {json.dumps(config.name)} is not allowed: it names another "
            f"file; allowed: {json.dumps(path.stem)} (the file name without .json)"
        )
    card = config.llama_server_flags
    problems = [f"{path}: $.llama_server_flags.{text}"
                for _, text in _settings_problems(card, config.fit_caps)]
    for key, rec in config.bundle_recommendations.items():
        own = set(rec.as_dict())
        where = _join("$.bundle_recommendations", key)
        problems += [f"{path}: {where}.{text}"
                     for involved, text in _settings_problems(card.overlaid(rec), config.fit_caps)
                     if own & involved]
    if problems:
        raise ConfigError("\n".join(problems))


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
