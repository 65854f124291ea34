"""The shipped GPU configs and fork KV types validate; a bad file is named precisely."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
from checkout import REPO_ROOT

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import (
    CACHE_TYPES,
    FORK_CACHE_TYPES,
    OPTIONAL_CARD_SETTINGS,
    SETTING_FIELDS,
    SETTING_NAMES,
    STOCK_CACHE_TYPES,
    FieldKind,
    FlashAttn,
    LoadMode,
    Provenance,
    ServerSettings,
    SplitMode,
    Vendor,
)
from harness.probes.gpu_configs import (
    GPU_CONFIG_DIR,
    KV_TYPES_PATH,
    load_fork_kv_types,
    load_gpu_configs,
)

SHIPPED = ("arc-a770", "h200", "mi300x", "rtx-3090", "rtx-4090", "rtx-5090", "rx-7900-xtx")
GPU_SCHEMA = json.loads((GPU_CONFIG_DIR / "schema.json").read_text(encoding="utf-8"))

Mutation = Callable[[dict[str, Any]], None]


def _card(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((GPU_CONFIG_DIR / f"{name}.json").read_text("utf-8"))
    return data


def _write(directory: Path, name: str, data: dict[str, Any]) -> Path:
    path = directory / f"{name}.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


# --- the shipped files -----------------------------------------------------------------


def test_every_shipped_config_validates() -> None:
    configs = load_gpu_configs()
    assert tuple(c.name for c in configs) == SHIPPED
    for config in configs:
        assert config.source == str(GPU_CONFIG_DIR / f"{config.name}.json")
        assert config.expected_metrics.provenance is Provenance.EXTRAPOLATED
        assert config.known_limits
        assert config.llama_server_flags.as_dict().keys() == (set(SETTING_NAMES)
                                                              - OPTIONAL_CARD_SETTINGS)


@pytest.mark.parametrize(
    ("name", "cc", "bandwidth", "headroom", "flags"),
    [
        pytest.param("rtx-3090", "8.6", 936, 3072,
                     (65536, 4, 2048, 512, "q8_0", "q4_polar", 8, 4, 16), id="rtx-3090"),
        pytest.param("rtx-4090", "8.9", 1008, 3072,
                     (32768, 8, 2048, 512, "qjl1_256", "q4_polar", 8, 4, 24), id="rtx-4090"),
        pytest.param("rtx-5090", "12.0", 1792, 4096,
                     (65536, 12, 4096, 1024, "qjl1_256", "q4_polar", 16, 4, 24), id="rtx-5090"),
        pytest.param("h200", "9.0", 4800, 6144,
                     (262144, 16, 4096, 2048, "qjl1_256", "q4_polar", 16, 8, 32), id="h200"),
    ],
)
def test_nvidia_cards_carry_the_reference_values(
    name: str, cc: str, bandwidth: int, headroom: int,
    flags: tuple[int, int, int, int, str, str, int, int, int],
) -> None:
    config = next(c for c in load_gpu_configs() if c.name == name)
    s = config.llama_server_flags
    assert (config.vendor, config.compute_capability, config.gfx_target) == (
        Vendor.NVIDIA, cc, None)
    assert config.memory_bandwidth_gbps == bandwidth
    assert config.reserved_headroom_mib == headroom
    assert (s.ctx_size, s.parallel, s.batch_size, s.ubatch_size, s.cache_type_k,
            s.cache_type_v, s.ctx_checkpoints, s.spec_draft_n_min, s.spec_draft_n_max) == flags
    assert s.n_gpu_layers == 999
    assert s.split_mode is SplitMode.NONE
    assert s.flash_attn is FlashAttn.ON
    assert s.load_mode is LoadMode.MMAP_MLOCK
    assert s.spec_draft_p_min == 0.5
    assert set(config.bundle_recommendations) == {
        "voice", "eliza-1-2b", "eliza-1-4b", "eliza-1-9b", "eliza-1-27b"}


@pytest.mark.parametrize(
    ("name", "vendor", "gfx", "backends", "vram"),
    [
        pytest.param("mi300x", Vendor.AMD, "gfx942", (Backend.ROCM, Backend.VULKAN), 192,
                     id="mi300x"),
        pytest.param("rx-7900-xtx", Vendor.AMD, "gfx1100", (Backend.ROCM, Backend.VULKAN), 24,
                     id="rx-7900-xtx"),
        pytest.param("arc-a770", Vendor.INTEL, None, (Backend.VULKAN,), 16, id="arc-a770"),
    ],
)
def test_amd_and_intel_cards(
    name: str, vendor: Vendor, gfx: str | None, backends: tuple[Backend, ...], vram: int,
) -> None:
    config = next(c for c in load_gpu_configs() if c.name == name)
    assert (config.vendor, config.gfx_target, config.backends, config.vram_gib) == (
        vendor, gfx, backends, vram)
    assert config.compute_capability is None
    # No fork KV kernels are known for these devices: stock cache types only.
    for settings in (config.llama_server_flags, *config.bundle_recommendations.values()):
        assert settings.cache_type_k in (None, *STOCK_CACHE_TYPES)
        assert settings.cache_type_v in (None, *STOCK_CACHE_TYPES)


def test_fork_kv_types_load_with_their_block_figures() -> None:
    types = {t.name: t for t in load_fork_kv_types()}
    assert tuple(types) == FORK_CACHE_TYPES
    assert (types["qjl1_256"].block_size, types["qjl1_256"].bytes_per_block) == (128, 34)
    assert (types["q4_polar"].block_size, types["q4_polar"].bytes_per_block) == (128, 82)
    assert types["q4_polar"].bits_per_value == 5.125


def test_schema_cache_types_match_code_and_kv_types_file() -> None:
    enum = tuple(GPU_SCHEMA["$defs"]["cache_type"]["enum"])
    assert enum == CACHE_TYPES
    assert tuple(t.name for t in load_fork_kv_types()) == FORK_CACHE_TYPES


@pytest.mark.parametrize("field", SETTING_FIELDS, ids=lambda f: f.name)
def test_schema_settings_match_the_field_registry(field: Any) -> None:
    props = GPU_SCHEMA["$defs"]["settings"]["properties"]
    assert tuple(props) == SETTING_NAMES
    prop = props[field.name]
    if "$ref" in prop:
        prop = GPU_SCHEMA["$defs"][prop["$ref"].rsplit("/", 1)[1]]
    expected_type = {FieldKind.INT: "integer", FieldKind.FLOAT: "number",
                     FieldKind.BOOL: "boolean"}
    if field.kind is FieldKind.CHOICE:
        assert tuple(prop["enum"]) == field.choices
    else:
        assert prop["type"] == expected_type[field.kind]
        assert prop.get("minimum") == field.minimum
        assert prop.get("maximum") == field.maximum
        assert prop.get("multipleOf") == field.multiple_of


# --- bad configs -----------------------------------------------------------------------


def _set(*keys: str, value: Any) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        node[keys[-1]] = value
    return mutate


def _drop(*keys: str) -> Mutation:
    def mutate(data: dict[str, Any]) -> None:
        node = data
        for key in keys[:-1]:
            node = node[key]
        del node[keys[-1]]
    return mutate


BAD_CASES = [
    pytest.param(_set("vram_gib", value="24"), "$.vram_gib", '"24"', "type number",
                 id="wrong-type-vram"),
    pytest.param(_set("llama_server_flags", "kv_offload", value="yes"),
                 "$.llama_server_flags.kv_offload", '"yes"', "type boolean",
                 id="wrong-type-bool"),
    pytest.param(_set("turbo", value=True), "$.turbo", "unknown key (value true)",
                 "allowed keys: $schema, architecture, backends,", id="unknown-key-top"),
    pytest.param(_set("llama_server_flags", "n_parallel", value=4),
                 "$.llama_server_flags.n_parallel", "unknown key (value 4)",
                 "allowed keys: batch_size, cache_type_k,", id="unknown-key-flags"),
    pytest.param(_set("bundle_recommendations", "voice", "max_parallel", value=2),
                 "$.bundle_recommendations.voice.max_parallel", "unknown key (value 2)",
                 "parallel", id="unknown-key-bundle"),
    pytest.param(_set("llama_server_flags", "parallel", value=0),
                 "$.llama_server_flags.parallel", "0 is not allowed",
                 "type integer, >= 1, <= 256", id="out-of-range-parallel"),
    pytest.param(_set("llama_server_flags", "ctx_size", value=8_000_000),
                 "$.llama_server_flags.ctx_size", "8000000 is not allowed",
                 "<= 4194304", id="out-of-range-ctx"),
    pytest.param(_set("llama_server_flags", "spec_draft_p_min", value=1.5),
                 "$.llama_server_flags.spec_draft_p_min", "1.5 is not allowed", "<= 1",
                 id="out-of-range-p-min"),
    pytest.param(_set("llama_server_flags", "cache_type_k", value="q3_k"),
                 "$.llama_server_flags.cache_type_k", '"q3_k" is not allowed',
                 'one of "f32", "f16"', id="bad-enum-cache-type"),
    pytest.param(_drop("llama_server_flags", "parallel"), "$.llama_server_flags.parallel",
                 "missing required key", "type integer, >= 1, <= 256",
                 id="missing-required-flag"),
    pytest.param(_drop("vendor"), "$.vendor", "missing required key",
                 'one of "nvidia", "amd", "intel"', id="missing-required-top"),
    pytest.param(_drop("compute_capability"), "$.compute_capability", "missing required key",
                 "NVIDIA cards state compute_capability", id="vendor-rule-missing"),
    pytest.param(_set("gfx_target", value="gfx1100"), "$.gfx_target", '"gfx1100"',
                 "no 'gfx_target' key (NVIDIA cards", id="vendor-rule-forbidden"),
    pytest.param(_set("backends", value=["cuda", "rocm"]), "$.backends[1]", '"rocm"',
                 'one of "cuda", "vulkan" (NVIDIA cards', id="vendor-rule-backend"),
    pytest.param(_set("match", value=["RTX (3090"]), "$.match[0]", '"RTX (3090"',
                 "a valid regex", id="bad-regex"),
    pytest.param(_set("bundle_recommendations", "Eliza 9B", value={"parallel": 1}),
                 "$.bundle_recommendations", 'key "Eliza 9B"', "matching /^[a-z0-9]",
                 id="bad-bundle-key"),
    pytest.param(_set("expected_metrics", "_provenance", value="guessed"),
                 "$.expected_metrics['_provenance']", '"guessed"',
                 'one of "measured", "extrapolated"', id="bad-provenance"),
    pytest.param(_set("name", value="rtx-3090-ti"), "$.name", '"rtx-3090-ti"',
                 '"rtx-3090" (the file name without .json)', id="name-not-file"),
    pytest.param(_set("llama_server_flags", "ubatch_size", value=4096),
                 "$.llama_server_flags.ubatch_size", "4096 is not allowed", "<= 2048",
                 id="ubatch-above-batch"),
    pytest.param(_set("bundle_recommendations", "voice", "parallel", value=9),
                 "$.bundle_recommendations.voice.parallel", "9 is not allowed", "<= 8",
                 id="parallel-above-fit-cap"),
    pytest.param(_set("bundle_recommendations", "eliza-1-2b", "parallel", value=12),
                 "$.bundle_recommendations['eliza-1-2b'].parallel", "12 is not allowed",
                 "<= 8", id="bundle-key-with-dashes-cap"),
    pytest.param(_set("bundle_recommendations", "eliza-1-2b", "parallel", value=0),
                 "$.bundle_recommendations['eliza-1-2b'].parallel", "0 is not allowed",
                 ">= 1", id="bundle-key-with-dashes-schema"),
    pytest.param(_set("bundle_recommendations", "voice", "spec_draft_n_min", value=20),
                 "$.bundle_recommendations.voice.spec_draft_n_min", "20 is not allowed",
                 "<= 16", id="draft-min-above-max"),
]


@pytest.mark.parametrize(("mutate", "json_path", "value", "allowed"), BAD_CASES)
def test_bad_config_message_names_file_path_value_and_constraint(
    tmp_path: Path, mutate: Mutation, json_path: str, value: str, allowed: str,
) -> None:
    data = _card("rtx-3090")
    mutate(data)
    path = _write(tmp_path, "rtx-3090", data)
    with pytest.raises(ConfigError) as info:
        load_gpu_configs(tmp_path)
    line = next((ln for ln in str(info.value).splitlines() if f": {json_path}:" in ln), None)
    assert line is not None, str(info.value)
    assert line.startswith(f"{path}: {json_path}: ")
    assert value in line
    assert allowed in line


def test_every_problem_in_a_file_is_reported_at_once(tmp_path: Path) -> None:
    data = _card("h200")
    data["vram_gib"] = -1
    data["llama_server_flags"]["batch_size"] = "big"
    del data["known_limits"]
    _write(tmp_path, "h200", data)
    with pytest.raises(ConfigError) as info:
        load_gpu_configs(tmp_path)
    lines = str(info.value).splitlines()
    assert len(lines) == 3
    assert [ln.split(": ")[1] for ln in lines] == [
        "$.known_limits", "$.llama_server_flags.batch_size", "$.vram_gib"]


def test_malformed_json_names_the_file(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{ not json", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken\.json: not valid JSON"):
        load_gpu_configs(tmp_path)


def test_an_empty_directory_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no GPU config files"):
        load_gpu_configs(tmp_path)


# --- bad fork KV type files -------------------------------------------------------------


def _kv_data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(KV_TYPES_PATH.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize(
    ("mutate", "json_path", "value", "allowed"),
    [
        pytest.param(_set("types", value=[{"name": "x", "block_size": 32,
                                           "bytes_per_block": 0}]),
                     "$.types[0].bytes_per_block", "0 is not allowed", "type integer, >= 1",
                     id="out-of-range-bytes"),
        pytest.param(_set("types", value=[{"name": "x", "block_size": "32",
                                           "bytes_per_block": 8}]),
                     "$.types[0].block_size", '"32" is not allowed', "type integer",
                     id="wrong-type-block"),
        pytest.param(_set("types", value=[{"name": "x", "block": 32, "block_size": 32,
                                           "bytes_per_block": 8}]),
                     "$.types[0].block", "unknown key (value 32)",
                     "allowed keys: block_size, bytes_per_block, name, note",
                     id="unknown-key"),
        pytest.param(_set("types", value=[{"name": "x", "block_size": 32}]),
                     "$.types[0].bytes_per_block", "missing required key", "type integer",
                     id="missing-required"),
        pytest.param(_set("types", value=[{"name": "x", "block_size": 32, "bytes_per_block": 8},
                                          {"name": "x", "block_size": 32,
                                           "bytes_per_block": 9}]),
                     "$.types[1].name", '"x" is not allowed: a duplicate',
                     "a name no other entry uses", id="duplicate-name"),
    ],
)
def test_bad_kv_types_message(
    tmp_path: Path, mutate: Mutation, json_path: str, value: str, allowed: str,
) -> None:
    data = _kv_data()
    mutate(data)
    path = tmp_path / "kv_types.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_fork_kv_types(path)
    line = next((ln for ln in str(info.value).splitlines() if f": {json_path}:" in ln), None)
    assert line is not None, str(info.value)
    assert line.startswith(f"{path}: {json_path}: ")
    assert value in line
    assert allowed in line


def test_every_duplicate_kv_name_is_reported_at_once(tmp_path: Path) -> None:
    entry = {"name": "x", "block_size": 32, "bytes_per_block": 8}
    path = tmp_path / "kv_types.json"
    path.write_text(json.dumps({"types": [entry, entry, {**entry, "name": "y"}, entry]}),
                    encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_fork_kv_types(path)
    assert str(info.value).splitlines() == [
        f'{path}: $.types[{index}].name: "x" is not allowed: a duplicate; allowed: a name no '
        "other entry uses" for index in (1, 3)]


def test_kv_types_default_path_is_in_the_repository() -> None:
    assert REPO_ROOT / "configs" / "gpu" / "kv_types.json" == KV_TYPES_PATH


def test_settings_fields_follow_the_registry_order() -> None:
    assert tuple(f.name for f in fields(ServerSettings)) == SETTING_NAMES
