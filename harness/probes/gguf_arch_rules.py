"""What each architecture makes of its GGUF header, as the pinned llama.cpp sets it (pure).

Ported from ``src/models/<arch>.cpp`` and ``src/llama-model.cpp``: the sliding window
and its per-layer pattern, the layers whose K/V cache another layer shares, the
recurrent layers of recurrent models and hybrids, and the memory layouts the KV planner
does not reproduce, with the reason. A new architecture in llama.cpp is a new row here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import gguf

from harness.probes.gguf_header import RECURRENT_LAYERS_KEY, GgufHeader, KeyFor

_K = gguf.Keys


class _SwaWhen(enum.Enum):
    """When an architecture switches its sliding window on."""

    ALWAYS = "always"
    #: only when ``attention.sliding_window`` is present and > 0 (gemma3, olmo2, ...)
    IF_WINDOW = "if-window"
    #: unless the key is present and 0 (llama4's chunked attention)
    UNLESS_ZERO = "unless-zero"


@dataclass(frozen=True)
class _SwaRule:
    """How ``load_arch_hparams`` sets ``n_swa`` and the per-layer ``is_swa`` flags.

    ``period`` is the default of ``load_swa_pattern``'s pattern (an integer
    ``sliding_window_pattern`` key overrides it, a bool array replaces it); 0 means the
    architecture reads only the array, which is then required.
    """

    period: int
    when: _SwaWhen = _SwaWhen.ALWAYS
    dense_first: bool = False
    #: n_swa before the key is read; the key, when present, replaces it.
    default_window: int = 0
    #: n_swa set after the key is read: the key only switches the window on.
    forced_window: int | None = None


_SWA_RULES: dict[str, _SwaRule] = {
    "gemma2": _SwaRule(2, default_window=4096),
    "gemma3": _SwaRule(6, _SwaWhen.IF_WINDOW),
    "gemma3n": _SwaRule(5),
    "gemma4": _SwaRule(0),
    "cohere2": _SwaRule(4),
    "cohere2moe": _SwaRule(4, dense_first=True),
    "olmo2": _SwaRule(4, _SwaWhen.IF_WINDOW),
    "exaone-moe": _SwaRule(4, default_window=128),
    "afmoe": _SwaRule(4, _SwaWhen.IF_WINDOW),
    "gpt-oss": _SwaRule(2),
    "mellum": _SwaRule(4, _SwaWhen.IF_WINDOW),
    "plamo3": _SwaRule(8, _SwaWhen.IF_WINDOW),
    "smallthinker": _SwaRule(4, _SwaWhen.IF_WINDOW, dense_first=True, forced_window=4096),
    "laguna": _SwaRule(4, _SwaWhen.IF_WINDOW, dense_first=True),
    "muse-glimmer": _SwaRule(4),
    "llama4": _SwaRule(4, _SwaWhen.UNLESS_ZERO, forced_window=8192),
    "granite_swa": _SwaRule(0),
    "mimo2": _SwaRule(0),
    "step35": _SwaRule(0),
    "maple": _SwaRule(0),
    "spark2_5": _SwaRule(0),
}
#: exaone4 turns its window on only for the 64-layer (32B) model, default window 4096.
_EXAONE4 = "exaone4"
_EXAONE4_SWA_LAYERS = 64

#: gemma3n hard-codes ``n_layer_kv_from_start = 20``: later layers reuse earlier caches.
_GEMMA3N = "gemma3n"
_GEMMA3N_KV_LAYERS = 20
#: gemma4 reads the count of trailing shared-KV layers from ``shared_kv_layers``.
_GEMMA4 = "gemma4"

#: Every trunk layer is recurrent (llm_arch_is_recurrent, Mamba-style state).
_ALL_RECURRENT = frozenset({"mamba", "mamba2"})
#: Hybrids whose recurrent layers are the ones without KV heads (``n_head_kv(il) == 0``).
_RECURRENT_WHERE_NO_KV_HEADS = frozenset({"jamba", "granitehybrid", "plamo2", "bailingmoe3"})
#: Hybrids with ``recurrent_layers`` or ``full_attention_interval`` (default 4): layer i is
#: full attention when ``(i + 1) % interval == 0``.
_RECURRENT_BY_INTERVAL = frozenset({"qwen3next", "qwen35", "qwen35moe"})
_DEFAULT_FULL_ATTENTION_INTERVAL = 4

_NO_CACHE = "encoder / embedding model: llama.cpp creates no KV cache for it"
_OWN_STATE = "its recurrent state is not Mamba-shaped (llama_hparams::n_embd_r/n_embd_s)"
#: Memory layouts the KV planner does not reproduce, with the reason.
_UNMODELLED: dict[str, str] = {
    **{arch: _NO_CACHE for arch in (
        "bert", "jina-bert-v2", "jina-bert-v3", "nomic-bert", "nomic-bert-moe", "neo-bert",
        "eurobert", "wavtokenizer-dec", "modern-bert", "gemma-embedding", "dream", "llada",
        "llada-moe", "rnd1", "clef", "t5encoder")},
    **{arch: _OWN_STATE for arch in (
        "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "lfm2", "lfm2moe", "kimi-linear",
        "kimi-k3", "minimax-01")},
    "t5": "encoder-decoder: the decoder's cross-attention memory is not a llama_kv_cache",
    "deepseek32": "DSA cache with a lightning-indexer key cache (llama_kv_cache_dsa)",
    "glm-dsa": "DSA cache with a lightning-indexer key cache (llama_kv_cache_dsa)",
    "deepseek4": "DeepSeek V4 compressed cache (llama_kv_cache_dsv4)",
    "dots3note": "DSA cache plus a windowed cache (llama_kv_cache_dsa_iswa)",
    "hy_v4": "indexer key cache on the full layers (llama_kv_cache_dsa)",
    "minimax-m3": "sparse-attention indexer cache (llama_kv_cache_msa)",
    "glm5-next": "hybrid with an indexer cache (llama_memory_hybrid_idx)",
    "qwen4exp": "hybrid with an indexer cache (llama_memory_hybrid_idx)",
    "falcon-h1": "every layer holds both a K/V cache and a recurrent state",
    "nemotron_h": "MLP-only layers hold neither cache; telling them apart needs n_ff per layer",
    "nemotron_h_moe": "MLP-only layers hold neither cache; telling them apart needs n_ff per layer",
    "gemma4-assistant": "draft model that shares the target context's K/V cache",
    "eagle3": "draft model that may share the target context",
    "dflash": "draft model that may share the target context",
    "hrm_text": "looped H/L stacks with their own cycle counts",
}
_MLA = "MLA: the cache holds the compressed latent (key_length_mla), not per-head K and V"


def sliding_window(header: GgufHeader, arch: str, block_count: int,
                   trunk: int) -> tuple[int | None, tuple[bool, ...]]:
    """``(n_swa, is_swa per layer)``; ``(None, all False)`` when llama.cpp uses no window."""
    off: tuple[bool, ...] = (False,) * block_count
    window_key = _K.Attention.SLIDING_WINDOW.format(arch=arch)
    pattern_key = _K.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch)
    raw_window = header.optional_integer(window_key)
    if arch == _EXAONE4:
        if trunk != _EXAONE4_SWA_LAYERS:
            return None, off
        rule = _SwaRule(4, default_window=4096)
    elif arch in _SWA_RULES:
        rule = _SWA_RULES[arch]
    else:
        return None, off
    if rule.when is _SwaWhen.IF_WINDOW and not raw_window:
        return None, off
    if rule.when is _SwaWhen.UNLESS_ZERO and raw_window == 0:
        return None, off
    window = raw_window if raw_window is not None else rule.default_window
    if rule.forced_window is not None:
        window = rule.forced_window
    flags = header.flags(pattern_key)
    if flags is not None:
        # get_arr fills the first entries; layers past the array stay full attention.
        return window, tuple(i < len(flags) and flags[i] for i in range(block_count))
    if rule.period == 0:
        raise header.missing(pattern_key, f"a {arch} model needs its per-layer "
                                          "sliding-window pattern as an array")
    period = header.integer(pattern_key, rule.period)
    return window, tuple(
        i < trunk and _swa_by_period(i, period, rule.dense_first) for i in range(block_count)
    )


def _swa_by_period(il: int, period: int, dense_first: bool) -> bool:
    # llama_hparams::set_swa_pattern
    if period == 0:
        return True
    if dense_first:
        return il % period != 0
    return il % period < period - 1


def recurrent_layers(header: GgufHeader, arch: str, head_count_kv: tuple[int, ...], trunk: int,
                     key: KeyFor) -> tuple[tuple[bool, ...], int | None]:
    """``(is_recr per layer, full-attention interval)`` for recurrent models and hybrids."""
    block_count = len(head_count_kv)
    if arch in _ALL_RECURRENT:
        return tuple(i < trunk for i in range(block_count)), None
    if arch in _RECURRENT_WHERE_NO_KV_HEADS:
        return tuple(i < trunk and head_count_kv[i] == 0 for i in range(block_count)), None
    if arch not in _RECURRENT_BY_INTERVAL:
        return (), None
    listed_key = key(RECURRENT_LAYERS_KEY)
    if header.has(listed_key):
        flags = header.flags(listed_key)
        if flags is None:
            return (bool(header.integer(listed_key)),) * block_count, None
        if len(flags) != block_count:
            raise header.invalid(listed_key, f"has {len(flags)} items, expected {block_count}")
        return flags, None
    interval = header.integer(key(_K.LLM.FULL_ATTENTION_INTERVAL),
                              _DEFAULT_FULL_ATTENTION_INTERVAL)
    if interval <= 0:
        raise header.invalid(key(_K.LLM.FULL_ATTENTION_INTERVAL), "must be at least 1")
    return tuple(i < trunk and (i + 1) % interval != 0 for i in range(block_count)), interval


def shared_kv_layers(header: GgufHeader, arch: str, block_count: int, key: KeyFor) -> int:
    """How many trailing layers reuse an earlier layer's K/V cache (gemma3n, gemma4)."""
    if arch == _GEMMA3N:
        return max(0, block_count - _GEMMA3N_KV_LAYERS)
    if arch == _GEMMA4:
        return min(block_count, header.integer(key(_K.Attention.SHARED_KV_LAYERS), 0))
    return 0


def kv_unmodelled(header: GgufHeader, arch: str, key: KeyFor) -> str | None:
    """Why the KV planner cannot size this model's memory; None when it can."""
    if arch in _UNMODELLED:
        return f"{arch}: {_UNMODELLED[arch]}"
    if header.has(key(_K.Attention.KEY_LENGTH_MLA)):
        return f"{arch}: {_MLA}"
    return None
