"""Autotune: config choice by name or VRAM bucket, layer order, origins, env overrides."""

from __future__ import annotations

import itertools
from dataclasses import replace
from types import MappingProxyType

import pytest

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.gpu import (
    OPTIONAL_CARD_SETTINGS,
    SETTING_NAMES,
    FlashAttn,
    GpuConfig,
    GpuInfo,
    LoadMode,
    ServerSettings,
    SettingValue,
)
from harness.planning.autotune import (
    VRAM_BUCKETS,
    Origin,
    TuneSource,
    autotune,
    bucket_for,
    env_settings,
)
from harness.probes.gpu_configs import load_gpu_configs

CONFIGS = load_gpu_configs()
BY_NAME = {c.name: c for c in CONFIGS}


def _tune(
    gpu: GpuInfo | None, bundle: str | None = None,
    call: dict[str, object] | None = None, env: dict[str, str] | None = None,
    configs: tuple[GpuConfig, ...] = CONFIGS,
) -> tuple[ServerSettings, dict[str, Origin], TuneSource, str | None]:
    result = autotune(gpu, configs, bundle, call or {}, env or {})
    return result.settings, dict(result.origins), result.source, result.label


# --- choosing by name ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "vram_mib", "config"),
    [
        pytest.param("NVIDIA GeForce RTX 3090", 24576, "rtx-3090", id="rtx-3090"),
        pytest.param("NVIDIA GeForce RTX 3090 Ti", 24564, "rtx-3090", id="rtx-3090-ti"),
        pytest.param("NVIDIA GeForce RTX 4090", 24564, "rtx-4090", id="rtx-4090"),
        pytest.param("NVIDIA GeForce RTX 5090", 32607, "rtx-5090", id="rtx-5090"),
        pytest.param("NVIDIA H200", 143771, "h200", id="h200"),
        pytest.param("NVIDIA H200 NVL", 143771, "h200", id="h200-nvl"),
        pytest.param("AMD Instinct MI300X", 196592, "mi300x", id="mi300x"),
        pytest.param("AMD Radeon RX 7900 XTX (RADV NAVI31)", 24560, "rx-7900-xtx",
                     id="rx-7900-xtx-vulkan-name"),
        pytest.param("Intel(R) Arc(TM) A770 Graphics", 16225, "arc-a770", id="arc-a770"),
        pytest.param("nvidia geforce rtx 4090", 24564, "rtx-4090", id="case-insensitive"),
    ],
)
def test_name_match_picks_the_card(device: str, vram_mib: int, config: str) -> None:
    result = autotune(GpuInfo(device, vram_mib), CONFIGS, None, {}, {})
    assert (result.source, result.label, result.config) == (
        TuneSource.MATCH, config, BY_NAME[config])
    assert result.settings == BY_NAME[config].llama_server_flags
    assert set(result.origins.values()) == {Origin.CARD}
    assert f"matched GPU config {config!r}" in result.headline


@pytest.mark.parametrize(
    ("device", "vram_mib", "label", "config"),
    [
        pytest.param("NVIDIA GeForce RTX 4090 Laptop GPU", 16376, "small", "rtx-3090",
                     id="laptop-4090-excluded-by-pattern"),
        pytest.param("NVIDIA H200", 18176, "small", "rtx-3090", id="h200-mig-slice"),
        pytest.param("NVIDIA H200", 71680, "large", "rtx-5090", id="h200-half-mig"),
        pytest.param("Intel(R) Arc(TM) A770 Graphics", 7956, "tiny", None, id="a770-8gb"),
    ],
)
def test_a_name_match_with_too_little_vram_falls_to_the_bucket(
    device: str, vram_mib: int, label: str, config: str | None,
) -> None:
    result = autotune(GpuInfo(device, vram_mib), CONFIGS, None, {}, {})
    assert result.label == label
    assert (result.config.name if result.config else None) == config
    assert result.source is (TuneSource.BUCKET if config else TuneSource.NONE)


def test_backend_outside_the_card_list_is_noted() -> None:
    result = autotune(GpuInfo("AMD Instinct MI300X", 196592, backend=Backend.CUDA), CONFIGS,
                      None, {}, {})
    assert result.source is TuneSource.MATCH
    assert any("backend 'cuda' is not among mi300x's backends" in r for r in result.reasons)


# --- VRAM buckets ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("device", "vram_mib", "label", "config", "parallel"),
    [
        pytest.param("NVIDIA GeForce GTX 1080 Ti", 11264, "tiny", None, None, id="tiny"),
        pytest.param("edge", 12287, "tiny", None, None, id="tiny-upper-edge"),
        pytest.param("edge", 12288, "small", "rtx-3090", 2, id="small-lower-edge"),
        pytest.param("Tesla T4", 15360, "small", "rtx-3090", 2, id="small"),
        pytest.param("NVIDIA L4", 23034, "mid", "rtx-3090", 4, id="mid"),
        pytest.param("edge", 28672, "mid-plus", "rtx-5090", 6, id="mid-plus-lower-edge"),
        pytest.param("Tesla V100-SXM2-32GB", 32768, "mid-plus", "rtx-5090", 6, id="mid-plus"),
        pytest.param("NVIDIA RTX A6000", 49140, "large", "rtx-5090", 12, id="large"),
        pytest.param("NVIDIA H100 80GB HBM3", 81559, "large", "rtx-5090", 12,
                     id="large-h100-just-under-80"),
        pytest.param("NVIDIA A100-SXM4-80GB", 81920, "huge", "h200", 16, id="huge-lower-edge"),
        pytest.param("NVIDIA B200", 183359, "huge", "h200", 16, id="huge"),
    ],
)
def test_bucket_fallback(
    device: str, vram_mib: int, label: str, config: str | None, parallel: int | None,
) -> None:
    result = autotune(GpuInfo(device, vram_mib), CONFIGS, None, {}, {})
    assert result.label == label
    assert result.bucket == bucket_for(vram_mib)
    if config is None:
        assert result.source is TuneSource.NONE
        assert result.config is None
        assert result.settings == ServerSettings()
        assert "below the smallest VRAM bucket" in result.headline
        return
    assert result.source is TuneSource.BUCKET
    assert result.config == BY_NAME[config]
    assert result.settings.parallel == parallel
    expected = replace(BY_NAME[config].llama_server_flags, parallel=parallel)
    assert result.settings == expected
    assert set(result.origins.values()) == {Origin.BUCKET}
    assert "NO tuned GPU config" in result.headline
    assert "not a tuned profile" in result.headline


def test_buckets_cover_every_size_in_order() -> None:
    assert [b.label for b in VRAM_BUCKETS] == [
        "tiny", "small", "mid", "mid-plus", "large", "huge"]
    for lower, upper in itertools.pairwise(VRAM_BUCKETS):
        assert lower.max_gib == upper.min_gib
    assert VRAM_BUCKETS[0].min_gib == 0
    assert VRAM_BUCKETS[-1].max_gib is None
    assert bucket_for(10**9).label == "huge"


@pytest.mark.parametrize(
    ("vram_mib", "bundle", "parallel", "ctx_size"),
    [
        pytest.param(15360, "eliza-1-2b", 4, 32768, id="small-halves-bundle-8"),
        pytest.param(15360, "eliza-1-27b", 1, 32768, id="small-halves-bundle-2"),
        pytest.param(32768, "eliza-1-27b", 1, 131072, id="mid-plus-never-below-1"),
        pytest.param(32768, "voice", 4, 8192, id="mid-plus-halves-voice-8"),
        pytest.param(20480, "eliza-1-2b", 8, 32768, id="mid-keeps-bundle"),
    ],
)
def test_bucket_scales_the_bundle_parallel(
    vram_mib: int, bundle: str, parallel: int, ctx_size: int,
) -> None:
    settings, origins, source, _ = _tune(GpuInfo("Unknown GPU", vram_mib), bundle)
    assert source is TuneSource.BUCKET
    assert (settings.parallel, settings.ctx_size) == (parallel, ctx_size)
    assert origins["ctx_size"] is Origin.BUNDLE
    scaled = bucket_for(vram_mib).parallel_scale != 1.0
    assert origins["parallel"] is (Origin.BUCKET if scaled else Origin.BUNDLE)


def test_missing_bucket_config_is_an_error() -> None:
    only = tuple(c for c in CONFIGS if c.name != "rtx-3090")
    with pytest.raises(ConfigError, match="'mid' falls back on GPU config 'rtx-3090'"):
        autotune(GpuInfo("Unknown GPU", 20480), only, None, {}, {})


def test_no_gpu_means_no_config_and_only_overrides() -> None:
    settings, origins, source, label = _tune(None, "eliza-1-2b", {"parallel": 2},
                                             {"HARNESS_LLAMA_CTX_SIZE": "4096"})
    assert (source, label) == (TuneSource.NONE, None)
    assert settings == ServerSettings(parallel=2, ctx_size=4096)
    assert origins == {"ctx_size": Origin.ENV, "parallel": Origin.CALL}


# --- layers and origins ----------------------------------------------------------------


def test_layers_apply_in_order_and_every_field_has_its_origin() -> None:
    result = autotune(
        GpuInfo("NVIDIA GeForce RTX 4090", 24564), CONFIGS, "eliza-1-2b",
        {"parallel": 3, "ubatch_size": 256, "flash_attn": "auto"},
        {"HARNESS_LLAMA_PARALLEL": "5", "HARNESS_LLAMA_CACHE_TYPE_V": "q8_0", "HOME": "/x"},
    )
    s, origins = result.settings, result.origins
    assert (s.parallel, s.ctx_size, s.ubatch_size, s.batch_size) == (5, 65536, 256, 2048)
    assert (s.cache_type_k, s.cache_type_v, s.flash_attn) == ("qjl1_256", "q8_0",
                                                             FlashAttn.AUTO)
    assert (s.ctx_checkpoints, s.checkpoint_min_step) == (4, 4096)
    assert dict(origins) == {
        "n_gpu_layers": Origin.CARD, "ctx_size": Origin.BUNDLE, "parallel": Origin.ENV,
        "batch_size": Origin.CARD, "ubatch_size": Origin.CALL, "cache_type_k": Origin.CARD,
        "cache_type_v": Origin.ENV, "flash_attn": Origin.CALL, "split_mode": Origin.CARD,
        "main_gpu": Origin.CARD, "kv_offload": Origin.CARD, "load_mode": Origin.CARD,
        "ctx_checkpoints": Origin.BUNDLE, "checkpoint_min_step": Origin.BUNDLE,
        "spec_draft_n_min": Origin.CARD, "spec_draft_n_max": Origin.CARD,
        "spec_draft_p_min": Origin.CARD,
    }
    assert tuple(origins) == tuple(n for n in SETTING_NAMES if n not in OPTIONAL_CARD_SETTINGS)
    assert result.bundle_key == "eliza-1-2b"
    assert [r.split(" ")[0] for r in result.reasons] == [
        "autotune:", "bundle", "per-call", "environment"]
    assert "HARNESS_LLAMA_PARALLEL -> parallel=5" in result.reasons[-1]


@pytest.mark.parametrize(
    ("bundle", "key"),
    [
        pytest.param("eliza-1-9b", "eliza-1-9b", id="exact"),
        pytest.param("eliza-1-9b-256k", "eliza-1-9b", id="class-prefix"),
        pytest.param("ELIZA-1-27B", "eliza-1-27b", id="case-insensitive"),
        pytest.param("eliza-1-9", None, id="not-a-dash-boundary"),
        pytest.param("tiny-dense", None, id="unknown"),
    ],
)
def test_bundle_recommendation_lookup(bundle: str, key: str | None) -> None:
    result = autotune(GpuInfo("NVIDIA H200", 143771), CONFIGS, bundle, {}, {})
    assert result.bundle_key == key
    if key is None:
        assert result.settings == BY_NAME["h200"].llama_server_flags
        assert any("has no recommendation" in r for r in result.reasons)


def test_exact_bundle_id_beats_the_longest_class() -> None:
    card = BY_NAME["rtx-4090"]
    recs = {"x": ServerSettings(parallel=1), "x-y": ServerSettings(parallel=2),
            "x-y-z": ServerSettings(parallel=3)}
    custom = replace(card, bundle_recommendations=MappingProxyType(recs))
    gpu = GpuInfo("NVIDIA GeForce RTX 4090", 24564)
    picks = {b: autotune(gpu, (custom,), b, {}, {}).settings.parallel
             for b in ("x", "x-y", "x-y-z", "x-y-q", "x-q")}
    assert picks == {"x": 1, "x-y": 2, "x-y-z": 3, "x-y-q": 2, "x-q": 1}


def test_per_call_none_means_no_override() -> None:
    settings, origins, _, _ = _tune(GpuInfo("NVIDIA GeForce RTX 3090", 24576),
                                    call={"parallel": None})
    assert settings.parallel == 4
    assert origins["parallel"] is Origin.CARD


@pytest.mark.parametrize(
    ("call", "message"),
    [
        pytest.param({"n_parallel": 4}, "per-call override 'n_parallel' is not a setting; "
                     "allowed: batch_size", id="unknown-key"),
        pytest.param({"parallel": "4"}, "per-call override 'parallel': '4' is not allowed; "
                     "allowed: an integer from 1 to 256", id="string-for-int"),
        pytest.param({"parallel": True}, "'parallel': True is not allowed", id="bool-for-int"),
        pytest.param({"ctx_size": 4194305}, "an integer from 0 to 4194304", id="above-max-ctx"),
        pytest.param({"kv_offload": 1}, "allowed: a boolean", id="int-for-bool"),
        pytest.param({"cache_type_k": "q3_k"}, "allowed: one of f32, f16", id="bad-choice"),
        pytest.param({"spec_draft_p_min": 2.0}, "from 0 to 1", id="above-max"),
    ],
)
def test_bad_per_call_override(call: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        autotune(GpuInfo("NVIDIA H200", 143771), CONFIGS, None, call, {})
    assert message in str(info.value)


# --- environment overrides -------------------------------------------------------------


@pytest.mark.parametrize(
    ("variable", "text", "field", "value"),
    [
        pytest.param("HARNESS_LLAMA_CTX_SIZE", "8192", "ctx_size", 8192, id="ctx-size"),
        pytest.param("HARNESS_LLAMA_PARALLEL", " 2 ", "parallel", 2, id="parallel-spaces"),
        pytest.param("HARNESS_LLAMA_CACHE_TYPE_K", "Q8_0", "cache_type_k", "q8_0",
                     id="cache-type-k-upper"),
        pytest.param("HARNESS_LLAMA_CACHE_TYPE_V", "q4_polar", "cache_type_v", "q4_polar",
                     id="cache-type-v-fork"),
        pytest.param("HARNESS_LLAMA_FLASH_ATTN", "OFF", "flash_attn", FlashAttn.OFF,
                     id="flash-attn"),
        pytest.param("HARNESS_LLAMA_KV_OFFLOAD", "no", "kv_offload", False, id="bool-no"),
        pytest.param("HARNESS_LLAMA_KV_OFFLOAD", "1", "kv_offload", True, id="bool-1"),
        pytest.param("HARNESS_LLAMA_LOAD_MODE", "mmap+mlock", "load_mode", LoadMode.MMAP_MLOCK,
                     id="load-mode"),
        pytest.param("HARNESS_LLAMA_SPEC_DRAFT_P_MIN", "0.75", "spec_draft_p_min", 0.75,
                     id="float"),
        pytest.param("HARNESS_LLAMA_SPEC_DRAFT_N_MAX", "0", "spec_draft_n_max", 0,
                     id="zero-allowed"),
    ],
)
def test_env_override_parsing(variable: str, text: str, field: str, value: SettingValue) -> None:
    settings = env_settings({variable: text})
    assert settings.as_dict() == {field: value}
    result = autotune(GpuInfo("NVIDIA GeForce RTX 5090", 32607), CONFIGS, None, {},
                      {variable: text})
    assert getattr(result.settings, field) == value
    assert result.origins[field] is Origin.ENV


def test_empty_env_value_is_unset_and_other_variables_are_ignored() -> None:
    assert env_settings({"HARNESS_LLAMA_PARALLEL": "", "HARNESS_CACHE": "/c",
                         "LLAMA_ARG_N_PARALLEL": "9"}) == ServerSettings()


@pytest.mark.parametrize(
    ("variable", "text", "allowed"),
    [
        pytest.param("HARNESS_LLAMA_PARALLEL", "four", "an integer from 1 to 256",
                     id="not-a-number"),
        pytest.param("HARNESS_LLAMA_PARALLEL", "0", "an integer from 1 to 256", id="below-min"),
        pytest.param("HARNESS_LLAMA_PARALLEL", "2.5", "an integer", id="float-for-int"),
        pytest.param("HARNESS_LLAMA_CTX_SIZE", "-1", "an integer from 0 to 4194304",
                     id="negative-ctx"),
        pytest.param("HARNESS_LLAMA_CACHE_TYPE_K", "q3_k",
                     "one of f32, f16, bf16, q8_0, q4_0, q4_1, iq4_nl, q5_0, q5_1, qjl1_256",
                     id="bad-cache-type"),
        pytest.param("HARNESS_LLAMA_FLASH_ATTN", "enabled", "one of on, off, auto",
                     id="bad-flash-attn"),
        pytest.param("HARNESS_LLAMA_KV_OFFLOAD", "maybe", "a boolean (true/false, 1/0",
                     id="bad-bool"),
        pytest.param("HARNESS_LLAMA_SPEC_DRAFT_P_MIN", "nan", "a number from 0 to 1", id="nan"),
        pytest.param("HARNESS_LLAMA_SPEC_DRAFT_P_MIN", "1.5", "a number from 0 to 1",
                     id="above-max"),
    ],
)
def test_bad_env_value_names_the_variable_and_allowed_values(
    variable: str, text: str, allowed: str,
) -> None:
    with pytest.raises(ConfigError) as info:
        autotune(GpuInfo("NVIDIA H200", 143771), CONFIGS, None, {}, {variable: text})
    message = str(info.value)
    assert message.startswith(f"environment variable {variable}={text!r} is not allowed; ")
    assert f"allowed: {allowed}" in message


def test_unknown_harness_llama_variable_lists_the_known_ones() -> None:
    with pytest.raises(ConfigError) as info:
        env_settings({"HARNESS_LLAMA_PARALEL": "2"})
    message = str(info.value)
    assert "HARNESS_LLAMA_PARALEL is not a llama-server setting" in message
    assert "HARNESS_LLAMA_PARALLEL" in message
    assert "HARNESS_LLAMA_CTX_SIZE" in message
