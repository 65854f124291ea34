"""Reads a GGUF model's header into ``ModelFacts`` with ``gguf.GGUFReader``.

The facts are the values llama.cpp itself derives when it loads the file (pinned source,
``src/llama-model.cpp`` and ``src/models/<arch>.cpp``): defaults it assumes for absent
keys, and what each architecture makes of its keys (``gguf_arch_rules``): the per-layer
sliding-window pattern, the layers whose K/V cache another layer shares, the recurrent
layers of hybrids. Keys are read through ``gguf_header``, whose errors name the key and
its offset. Tensor bytes are split per block the way the offload flags move them
(``common/common.h``'s override regexes).

A file ``GGUFReader`` cannot parse, or whose tensor data runs past its end, raises
``ModelFileError`` naming the file and the offset and field where it breaks: the reader's
own errors (``IndexError: index 0 is out of bounds``) say neither, so ``gguf_damage``
walks the header to locate the damage.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import gguf

from harness.errors import ModelFileError
from harness.facts.model_facts import LayerBytes, ModelFacts, SsmFacts
from harness.planning.lazy_tensors import LAZY_READ_TENSORS
from harness.probes.gguf_arch_rules import (
    kv_unmodelled,
    recurrent_layers,
    shared_kv_layers,
    sliding_window,
)
from harness.probes.gguf_damage import locate_damage
from harness.probes.gguf_header import NUM_LOOPS_KEY, GgufHeader, KeyFor

_K = gguf.Keys
_MAX_LAYERS = 512  # LLAMA_MAX_LAYERS (src/llama-hparams.h): llama.cpp refuses more blocks


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
_OUTPUT_WEIGHT = str(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.OUTPUT]) + ".weight"
_TOKEN_EMBD_WEIGHT = str(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_EMBD]) + ".weight"
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
    header = GgufHeader(path, reader)
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
    swa_window, swa_layers = sliding_window(header, arch, block_count, trunk)
    head_count_kv = header.per_layer(key(_K.Attention.HEAD_COUNT_KV), block_count, heads)
    recurrent, interval = recurrent_layers(header, arch, head_count_kv, trunk, key)
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
        shared_kv_layers=shared_kv_layers(header, arch, block_count, key),
        full_attention_interval=interval,
        recurrent_layers=recurrent,
        ssm=_ssm(header, key),
        expert_count=header.integer(key(_K.LLM.EXPERT_COUNT), 0),
        expert_used_count=max(header.per_layer(key(_K.LLM.EXPERT_USED_COUNT), block_count,
                                               (0,) * block_count)),
        nextn_predict_layers=nextn,
        loop_count=max(1, header.integer(key(NUM_LOOPS_KEY), 1)),
        kv_unmodelled=kv_unmodelled(header, arch, key),
        layer_bytes=layer_bytes,
        non_layer_bytes=non_layer_bytes,
        output_bytes=_output_bytes(reader.tensors),
        lazy_marked=tuple((str(t.name), int(t.n_bytes)) for t in reader.tensors
                          if str(t.name) in LAZY_READ_TENSORS.get(arch, ())),
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


# --- derived facts --------------------------------------------------------------------


def _ssm(header: GgufHeader, key: KeyFor) -> SsmFacts | None:
    keys = (_K.SSM.CONV_KERNEL, _K.SSM.INNER_SIZE, _K.SSM.STATE_SIZE, _K.SSM.GROUP_COUNT,
            _K.SSM.TIME_STEP_RANK)
    if not any(header.has(key(k)) for k in keys):
        return None
    conv, inner, state, groups, rank = (header.integer(key(k), 0) for k in keys)
    return SsmFacts(conv_kernel=conv, inner_size=inner, state_size=state, group_count=groups,
                    time_step_rank=rank)


def _vocab_size(header: GgufHeader, reader: Any, key: KeyFor) -> int:
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


def _output_bytes(tensors: Sequence[Any]) -> int:
    """``output.weight``'s bytes, else (tied embeddings) ``token_embd.weight``'s."""
    sizes = {str(t.name): int(t.n_bytes) for t in tensors}
    return sizes.get(_OUTPUT_WEIGHT, sizes.get(_TOKEN_EMBD_WEIGHT, 0))


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
