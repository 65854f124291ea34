"""Reads a GGUF model's header into ``ModelFacts`` with ``gguf.GGUFReader``.

The facts are the values llama.cpp itself derives when it loads the file (pinned source,
``src/llama-model.cpp`` and ``src/models/<arch>.cpp``): defaults it assumes for absent
keys, the per-layer sliding-window pattern each architecture sets, the layers whose K/V
cache another layer shares, the recurrent layers of hybrids. Tensor bytes are split per
block the way the offload flags move them (``common/common.h``'s override regexes).

A file ``GGUFReader`` cannot parse, or whose tensor data runs past its end, raises
``ModelFileError`` naming the file and the offset and field where it breaks: the reader's
own errors (``IndexError: index 0 is out of bounds``) say neither, so ``gguf_damage``
walks the header to locate the damage.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from harness.errors import ModelFileError
from harness.facts.model import LayerBytes, ModelFacts, SsmFacts
from harness.probes.gguf_damage import locate_damage

_K = gguf.Keys
_V = gguf.GGUFValueType

# Two keys the pinned llama.cpp reads that gguf 0.19's ``Keys`` does not name yet
# (src/llama-arch.cpp: LLM_KV_NUM_LOOPS, LLM_KV_ATTENTION_RECURRENT_LAYERS). A newer
# gguf's own constant wins when it has one.
NUM_LOOPS_KEY: str = getattr(_K.LLM, "NUM_LOOPS", "{arch}.num_loops")
RECURRENT_LAYERS_KEY: str = getattr(
    _K.Attention, "RECURRENT_LAYERS", "{arch}.attention.recurrent_layers"
)

_INT_TYPES = frozenset({_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32,
                        _V.UINT64, _V.INT64})
_BOOLISH_TYPES = _INT_TYPES | {_V.BOOL}
_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h): llama.cpp refuses more blocks


# --- architecture rules (the pinned source's src/models/<arch>.cpp) --------------------


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

#: Formats a gguf key template with the model's architecture.
_KeyFor = Callable[[str], str]


# --- tensor classes (common/common.h LLM_FFN_EXPS_REGEX / LLM_FFN_DENSE_REGEX) ----------


def _block_base(tensor: Any) -> str:
    """``blk.{bid}.ffn_up`` -> ``ffn_up``: the part of gguf's name after the block index."""
    return str(gguf.TENSOR_NAMES[tensor]).split("{bid}.", 1)[1]


_T = gguf.MODEL_TENSOR
#: Routed experts: what ``--cpu-moe`` / ``--n-cpu-moe`` keep in system RAM.
_EXPERT_BASES = frozenset(_block_base(t) for t in (
    _T.FFN_GATE_EXP, _T.FFN_UP_EXP, _T.FFN_DOWN_EXP, _T.FFN_GATE_UP_EXP,
    _T.FFN_GATE_CHEXP, _T.FFN_UP_CHEXP, _T.FFN_DOWN_CHEXP))
#: Dense FFN (what ``--n-cpu-ffn`` moves) and the shared experts.
_DENSE_FFN_BASES = frozenset(_block_base(t) for t in (
    _T.FFN_GATE, _T.FFN_UP, _T.FFN_DOWN, _T.FFN_GATE_SHEXP, _T.FFN_UP_SHEXP,
    _T.FFN_DOWN_SHEXP))
_BLOCK_PREFIX = str(gguf.TENSOR_NAMES[_T.FFN_UP]).split("{bid}", 1)[0]
_BLOCK_NAME = re.compile(re.escape(_BLOCK_PREFIX) + r"(\d+)\.([^.]+)")


# --- the public probe -----------------------------------------------------------------


def read_model_facts(path: Path) -> ModelFacts:
    """Read ``path``'s header; ``ModelFileError`` if it is not a whole, readable GGUF."""
    try:
        file_size = path.stat().st_size
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the model file ({exc})") from exc
    reader = _open_reader(path, file_size)
    _check_tensor_bounds(path, reader, file_size)
    header = _Header(path, reader)
    arch = header.string(_K.General.ARCHITECTURE)

    def key(template: str) -> str:
        return template.format(arch=arch)

    block_count = header.integer(key(_K.LLM.BLOCK_COUNT))
    if not 0 < block_count <= _MAX_LAYERS:
        raise header.invalid(key(_K.LLM.BLOCK_COUNT),
                             f"is {block_count}; llama.cpp loads 1 to {_MAX_LAYERS} blocks")
    nextn = header.integer(key(_K.LLM.NEXTN_PREDICT_LAYERS), 0)
    if nextn > block_count:
        raise header.invalid(key(_K.LLM.NEXTN_PREDICT_LAYERS),
                             f"is {nextn}, more than the {block_count} blocks")
    embedding_length = header.integer(key(_K.LLM.EMBEDDING_LENGTH))
    heads = header.per_layer(key(_K.Attention.HEAD_COUNT), block_count, (0,) * block_count)
    head_count = heads[0]
    head_width = embedding_length // head_count if head_count else 0
    trunk = block_count - nextn
    swa_window, swa_layers = _sliding_window(header, arch, block_count, trunk)
    head_count_kv = header.per_layer(key(_K.Attention.HEAD_COUNT_KV), block_count, heads)
    recurrent, interval = _recurrent_layers(header, arch, head_count_kv, trunk, key)
    layer_bytes, non_layer_bytes = _tensor_bytes(reader.tensors, block_count)
    return ModelFacts(
        path=str(path),
        file_size=file_size,
        architecture=arch,
        block_count=block_count,
        context_length=header.integer(key(_K.LLM.CONTEXT_LENGTH)),
        embedding_length=embedding_length,
        head_count=head_count,
        head_count_kv=head_count_kv,
        key_length=header.integer(key(_K.Attention.KEY_LENGTH), head_width),
        value_length=header.integer(key(_K.Attention.VALUE_LENGTH), head_width),
        key_length_swa=header.optional_integer(key(_K.Attention.KEY_LENGTH_SWA)),
        value_length_swa=header.optional_integer(key(_K.Attention.VALUE_LENGTH_SWA)),
        vocab_size=_vocab_size(header, reader, key),
        sliding_window=swa_window,
        swa_layers=swa_layers,
        shared_kv_layers=_shared_kv_layers(header, arch, block_count, key),
        full_attention_interval=interval,
        recurrent_layers=recurrent,
        ssm=_ssm(header, key),
        expert_count=header.integer(key(_K.LLM.EXPERT_COUNT), 0),
        expert_used_count=max(header.per_layer(key(_K.LLM.EXPERT_USED_COUNT), block_count,
                                               (0,) * block_count)),
        nextn_predict_layers=nextn,
        loop_count=max(1, header.integer(key(NUM_LOOPS_KEY), 1)),
        kv_unmodelled=_unmodelled(header, arch, key),
        layer_bytes=layer_bytes,
        non_layer_bytes=non_layer_bytes,
    )


# --- reading the file -----------------------------------------------------------------


def _open_reader(path: Path, file_size: int) -> Any:
    if file_size == 0:
        raise ModelFileError(f"{path}: the file is empty (0 bytes), not a GGUF model")
    try:
        return gguf.GGUFReader(path)
    # The reader signals damage with whatever numpy raises on a short buffer.
    except (ValueError, IndexError, KeyError, TypeError, OverflowError, MemoryError) as exc:
        damage = locate_damage(path, file_size)
        detail = damage or f"gguf.GGUFReader cannot parse it: {type(exc).__name__}: {exc}"
        raise ModelFileError(
            f"{path}: corrupt or truncated GGUF ({file_size} bytes): {detail}; "
            "re-download or regenerate the file"
        ) from exc
    except OSError as exc:
        raise ModelFileError(f"{path}: cannot read the model file ({exc})") from exc


def _check_tensor_bounds(path: Path, reader: Any, file_size: int) -> None:
    for tensor in reader.tensors:
        end = int(tensor.data_offset) + int(tensor.n_bytes)
        if end > file_size:
            raise ModelFileError(
                f"{path}: truncated GGUF: tensor '{tensor.name}' at offset "
                f"{tensor.data_offset} needs {tensor.n_bytes} bytes up to offset {end}, but "
                f"the file ends at offset {file_size}; re-download or regenerate the file"
            )


class _Header:
    """Typed access to the header's key/value fields; errors name the key and offset."""

    def __init__(self, path: Path, reader: Any) -> None:
        self._path = path
        self._fields: dict[str, Any] = dict(reader.fields)

    def has(self, key: str) -> bool:
        return key in self._fields

    def invalid(self, key: str, problem: str) -> ModelFileError:
        field = self._fields.get(key)
        where = f" at offset {field.offset}" if field is not None else ""
        return ModelFileError(f"{self._path}: GGUF key '{key}'{where} {problem}")

    def missing(self, key: str, why: str = "llama.cpp requires it to load the model",
                ) -> ModelFileError:
        return ModelFileError(f"{self._path}: GGUF key '{key}' is missing; {why}")

    def _describe(self, field: Any) -> str:
        return "/".join(t.name for t in field.types) or "nothing"

    def string(self, key: str) -> str:
        field = self._fields.get(key)
        if field is None:
            raise self.missing(key)
        if field.types != [_V.STRING]:
            raise self.invalid(key, f"holds {self._describe(field)}, expected a string")
        return str(field.contents())

    def optional_integer(self, key: str) -> int | None:
        field = self._fields.get(key)
        if field is None:
            return None
        if len(field.types) != 1 or field.types[0] not in _INT_TYPES:
            raise self.invalid(key, f"holds {self._describe(field)}, expected an integer")
        return int(field.contents())

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.optional_integer(key)
        if value is not None:
            return value
        if default is None:
            raise self.missing(key)
        return default

    def flags(self, key: str) -> tuple[bool, ...] | None:
        """A bool (or integer) array key, as llama.cpp's ``get_arr`` reads it; else None."""
        field = self._fields.get(key)
        if field is None or field.types[0] != _V.ARRAY:
            return None
        if field.types[1:] and field.types[-1] not in _BOOLISH_TYPES:
            raise self.invalid(key, f"holds {self._describe(field)}, expected bools")
        return tuple(bool(v) for v in field.contents())

    def per_layer(self, key: str, n: int, default: tuple[int, ...]) -> tuple[int, ...]:
        """A scalar repeated for every layer, or an array of exactly ``n`` items
        (``get_key_or_arr``)."""
        field = self._fields.get(key)
        if field is None:
            return default
        if field.types[0] != _V.ARRAY:
            return (self.integer(key),) * n
        if field.types[1:] and field.types[-1] not in _INT_TYPES:
            raise self.invalid(key, f"holds {self._describe(field)}, expected integers")
        values = tuple(int(v) for v in field.contents())
        if len(values) != n:
            raise self.invalid(key, f"has {len(values)} items, expected one per layer ({n})")
        return values

    def array_length(self, key: str) -> int | None:
        field = self._fields.get(key)
        if field is None or field.types[0] != _V.ARRAY:
            return None
        return len(field.data)


# --- derived facts --------------------------------------------------------------------


def _sliding_window(header: _Header, arch: str, block_count: int,
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


def _recurrent_layers(header: _Header, arch: str, head_count_kv: tuple[int, ...], trunk: int,
                      key: _KeyFor) -> tuple[tuple[bool, ...], int | None]:
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


def _shared_kv_layers(header: _Header, arch: str, block_count: int, key: _KeyFor) -> int:
    if arch == _GEMMA3N:
        return max(0, block_count - _GEMMA3N_KV_LAYERS)
    if arch == _GEMMA4:
        return min(block_count, header.integer(key(_K.Attention.SHARED_KV_LAYERS), 0))
    return 0


def _ssm(header: _Header, key: _KeyFor) -> SsmFacts | None:
    keys = (_K.SSM.CONV_KERNEL, _K.SSM.INNER_SIZE, _K.SSM.STATE_SIZE, _K.SSM.GROUP_COUNT,
            _K.SSM.TIME_STEP_RANK)
    if not any(header.has(key(k)) for k in keys):
        return None
    conv, inner, state, groups, rank = (header.integer(key(k), 0) for k in keys)
    return SsmFacts(conv_kernel=conv, inner_size=inner, state_size=state, group_count=groups,
                    time_step_rank=rank)


def _unmodelled(header: _Header, arch: str, key: _KeyFor) -> str | None:
    if arch in _UNMODELLED:
        return f"{arch}: {_UNMODELLED[arch]}"
    if header.has(key(_K.Attention.KEY_LENGTH_MLA)):
        return f"{arch}: {_MLA}"
    return None


def _vocab_size(header: _Header, reader: Any, key: _KeyFor) -> int:
    explicit = header.optional_integer(key(_K.LLM.VOCAB_SIZE))
    if explicit is not None:
        return explicit
    listed = header.array_length(_K.Tokenizer.LIST)
    if listed is not None:
        return listed
    embd = str(gguf.TENSOR_NAMES[_T.TOKEN_EMBD])
    for tensor in reader.tensors:
        if tensor.name.startswith(embd + "."):
            return int(tensor.shape[-1])
    return 0


def _tensor_bytes(tensors: Sequence[Any], block_count: int) -> tuple[tuple[LayerBytes, ...], int]:
    """``(layer_bytes, non_layer_bytes)``: tensor bytes per block, split by what the offload
    flags move, and the bytes outside any block."""
    expert = [0] * block_count
    dense = [0] * block_count
    other = [0] * block_count
    non_layer = 0
    for tensor in tensors:
        size = int(tensor.n_bytes)
        match = _BLOCK_NAME.match(tensor.name)
        if match is None or int(match[1]) >= block_count:
            non_layer += size
            continue
        il, base = int(match[1]), match[2]
        if base in _EXPERT_BASES:
            expert[il] += size
        elif base in _DENSE_FFN_BASES:
            dense[il] += size
        else:
            other[il] += size
    layers = tuple(LayerBytes(index=i, expert=expert[i], dense_ffn=dense[i], other=other[i])
                   for i in range(block_count))
    return layers, non_layer


# --- locating damage ------------------------------------------------------------------
