"""Tensor layouts: which tensors each architecture needs, with their names and shapes.

The lists mirror what llama.cpp's loaders create for the architecture
(``src/models/llama.cpp``, ``gemma2.cpp``, ``glm4-moe.cpp``, ``gemma4.cpp`` in the pinned
source); names
come from gguf's ``TENSOR_NAMES``. Shapes are numpy order, i.e. ggml's ``ne`` reversed
(ggml ``{n_embd, n_vocab}`` is numpy ``(n_vocab, n_embd)``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import gguf

from harness.errors import FixtureError
from harness.modelgen.specs import Architecture, ModelShape

T = gguf.MODEL_TENSOR


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write: its gguf kind, full name and numpy shape."""

    kind: Any  # a gguf.MODEL_TENSOR member
    name: str
    shape: tuple[int, ...]


def _name(kind: Any, bid: int | None = None, suffix: str = "weight") -> str:
    base: str = gguf.TENSOR_NAMES[kind]
    return f"{base.format(bid=bid) if bid is not None else base}.{suffix}"


class _Builder:
    def __init__(self, shape: ModelShape, n_vocab: int) -> None:
        self.s = shape
        self.n_vocab = n_vocab
        self.out: list[TensorPlan] = []

    def add(
        self, kind: Any, shape: tuple[int, ...], bid: int | None = None, suffix: str = "weight"
    ) -> None:
        self.out.append(TensorPlan(kind, _name(kind, bid, suffix), shape))

    def embeddings(self) -> None:
        self.add(T.TOKEN_EMBD, (self.n_vocab, self.s.embedding_length))

    def head(self, *, with_output: bool = True) -> None:
        e = self.s.embedding_length
        self.add(T.OUTPUT_NORM, (e,))
        if with_output:
            self.add(T.OUTPUT, (self.n_vocab, e))

    def attention(self, bid: int) -> None:
        s, e, d = self.s, self.s.embedding_length, self.s.key_length
        self.add(T.ATTN_NORM, (e,), bid)
        self.add(T.ATTN_Q, (s.head_count * d, e), bid)
        self.add(T.ATTN_K, (s.head_count_kv * d, e), bid)
        self.add(T.ATTN_V, (s.head_count_kv * d, e), bid)
        self.add(T.ATTN_OUT, (e, s.head_count * d), bid)

    def dense_ffn(self, bid: int) -> None:
        e, f = self.s.embedding_length, self.s.feed_forward_length
        self.add(T.FFN_GATE, (f, e), bid)
        self.add(T.FFN_UP, (f, e), bid)
        self.add(T.FFN_DOWN, (e, f), bid)

    def experts(self, bid: int, n_ff: int) -> None:
        e, x = self.s.embedding_length, self.s.expert_count
        self.add(T.FFN_GATE_INP, (x, e), bid)
        self.add(T.FFN_GATE_EXP, (x, n_ff, e), bid)
        self.add(T.FFN_UP_EXP, (x, n_ff, e), bid)
        self.add(T.FFN_DOWN_EXP, (x, e, n_ff), bid)


def _llama(b: _Builder) -> None:
    b.embeddings()
    for bid in range(b.s.block_count):
        b.attention(bid)
        b.add(T.FFN_NORM, (b.s.embedding_length,), bid)
        if b.s.expert_count:
            # llama's MoE reads the expert width from feed_forward_length.
            b.experts(bid, b.s.feed_forward_length)
        else:
            b.dense_ffn(bid)
    b.head()


def _gemma2(b: _Builder) -> None:
    e = b.s.embedding_length
    b.embeddings()
    for bid in range(b.s.block_count):
        b.attention(bid)
        b.add(T.ATTN_POST_NORM, (e,), bid)
        # gguf names gemma2's pre-FFN norm FFN_PRE_NORM; it is "blk.N.ffn_norm" on disk.
        b.add(T.FFN_PRE_NORM, (e,), bid)
        b.dense_ffn(bid)
        b.add(T.FFN_POST_NORM, (e,), bid)
    # gemma2 has no output.weight: its logits reuse token_embd (tied embeddings).
    b.head(with_output=False)


def _glm4moe(b: _Builder) -> None:
    s, e = b.s, b.s.embedding_length
    assert s.expert_feed_forward_length is not None  # validated by specs
    assert s.leading_dense_block_count is not None
    n_ff_exp = s.expert_feed_forward_length
    b.embeddings()
    for bid in range(s.block_count):
        b.attention(bid)
        b.add(T.ATTN_POST_NORM, (e,), bid)
        if bid < s.leading_dense_block_count:
            b.dense_ffn(bid)
        else:
            b.experts(bid, n_ff_exp)
            b.add(T.FFN_EXP_PROBS_B, (s.expert_count,), bid, suffix="bias")
            shexp = n_ff_exp * (s.expert_shared_count or 0)
            if shexp:
                b.add(T.FFN_GATE_SHEXP, (shexp, e), bid)
                b.add(T.FFN_UP_SHEXP, (shexp, e), bid)
                b.add(T.FFN_DOWN_SHEXP, (e, shexp), bid)
        if bid >= s.trunk_block_count:
            # The MTP head: concat(enorm(embd), hnorm(h)) -> eh_proj -> this block.
            b.add(T.NEXTN_EH_PROJ, (e, 2 * e), bid)
            b.add(T.NEXTN_ENORM, (e,), bid)
            b.add(T.NEXTN_HNORM, (e,), bid)
            b.add(T.NEXTN_SHARED_HEAD_NORM, (e,), bid)
    b.head()


def _gemma4(b: _Builder) -> None:
    """src/models/gemma4.cpp: gemma2's norms plus Q/K norms, one shared RoPE factor tensor
    for the full-attention layers, and per-layer embeddings (``per_layer_token_embd``, the
    tensor the loader reads lazily) with their projections."""
    s, e, d = b.s, b.s.embedding_length, b.s.key_length
    assert s.embedding_length_per_layer is not None  # validated by specs
    ple = s.embedding_length_per_layer
    b.embeddings()
    b.add(T.PER_LAYER_TOKEN_EMBD, (b.n_vocab, ple * s.block_count))
    b.add(T.PER_LAYER_MODEL_PROJ, (ple * s.block_count, e))
    b.add(T.PER_LAYER_PROJ_NORM, (ple,))
    b.add(T.ROPE_FREQS, (d // 2,))
    for bid in range(s.block_count):
        b.attention(bid)
        b.add(T.ATTN_Q_NORM, (d,), bid)
        b.add(T.ATTN_K_NORM, (d,), bid)
        b.add(T.ATTN_POST_NORM, (e,), bid)
        b.add(T.FFN_PRE_NORM, (e,), bid)  # "blk.N.ffn_norm" on disk, as for gemma2
        b.dense_ffn(bid)
        b.add(T.FFN_POST_NORM, (e,), bid)
        b.add(T.PER_LAYER_INP_GATE, (ple, e), bid)
        b.add(T.PER_LAYER_PROJ, (e, ple), bid)
        b.add(T.PER_LAYER_POST_NORM, (e,), bid)
    # Tied like gemma2: the loader duplicates token_embd when output.weight is absent.
    b.head(with_output=False)


_LAYOUTS: dict[Architecture, Callable[[_Builder], None]] = {
    Architecture.LLAMA: _llama,
    Architecture.GEMMA2: _gemma2,
    Architecture.GLM4_MOE: _glm4moe,
    Architecture.GEMMA4: _gemma4,
}


def plan_tensors(shape: ModelShape, n_vocab: int) -> list[TensorPlan]:
    """The tensors of one model, in the (stable) order they are written."""
    builder = _Builder(shape, n_vocab)
    _LAYOUTS[shape.architecture](builder)
    allowed = set(gguf.MODEL_TENSORS[shape.architecture.model_arch])
    for plan in builder.out:
        # A guard against writer bugs: gguf itself lists the tensors each arch may have.
        if plan.kind not in allowed:
            raise FixtureError(f"{plan.name} is not a {shape.architecture.value} tensor in gguf")
    return builder.out
