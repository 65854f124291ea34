"""One attention sub-block on the normed residual: Q/K/V, RoPE, attention, output.

The steps every supported graph shares: ``build_qkv`` (src/llama-graph.cpp: separate
``attn_q``/``attn_k``/``attn_v`` products, each bias added when the file has it), the
optional per-head RMS norms ``attn_q_norm``/``attn_k_norm`` before RoPE (glm4-moe.cpp),
``ggml_rope_ext`` on Q and K, an optional scale of Q (gemma2.cpp's
``ggml_scale(Qcur, f_attention_scale)``), ``build_attn`` and the ``attn_output`` product
(plus its bias where llama.cpp reads one).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from harness.errors import FixtureError
from harness.reference.attention import attention
from harness.reference.hparams import HParams
from harness.reference.named_tensors import Weights
from harness.reference.ops import linear, rms_norm
from harness.reference.rope import apply_rope

F64 = NDArray[np.float64]


@dataclass(frozen=True)
class AttentionCall:
    """The per-layer choices of one attention sub-block.

    ``angles``: the RoPE angles for this layer's base (``rope_angles``); ``allowed``:
    the KQ mask (``kq_mask``); ``q_scale``/``kq_scale``: where the graph puts the
    attention scale; ``qk_norm``: whether the graph reads ``attn_q_norm``/``attn_k_norm``;
    ``out_bias``: whether it reads ``attn_output.bias``.
    """

    angles: F64
    allowed: NDArray[np.bool_]
    kq_scale: float
    q_scale: float = 1.0
    softcap: float | None = None
    qk_norm: bool = False
    out_bias: bool = False


def self_attention(w: Weights, hp: HParams, il: int, x: F64, call: AttentionCall) -> F64:
    """The attention output ``(T, n_embd)`` of layer ``il`` for its normed input ``x``."""
    if f"blk.{il}.attn_qkv.weight" in w:
        raise FixtureError(f"{w.path}: fused attn_qkv tensors are not supported by the reference")
    n_tokens = x.shape[0]
    d = hp.head_dim

    def project(name: str, n_heads: int) -> F64:
        out = linear(x, w.block(il, f"{name}.weight"), w.block_optional(il, f"{name}.bias"))
        return out.reshape(n_tokens, n_heads, d)

    q = project("attn_q", hp.n_head)
    k = project("attn_k", hp.n_head_kv)
    v = project("attn_v", hp.n_head_kv)
    if call.qk_norm:
        q_norm = w.block_optional(il, "attn_q_norm.weight")
        k_norm = w.block_optional(il, "attn_k_norm.weight")
        if q_norm is not None:
            q = rms_norm(q, q_norm, hp.rms_eps)
        if k_norm is not None:
            k = rms_norm(k, k_norm, hp.rms_eps)
    q = apply_rope(q, call.angles, hp.rope_type)
    k = apply_rope(k, call.angles, hp.rope_type)
    if call.q_scale != 1.0:
        q = q * call.q_scale
    out = attention(
        q, k, v, kq_scale=call.kq_scale, allowed=call.allowed, softcap=call.softcap
    )
    out_b = w.block_optional(il, "attn_output.bias") if call.out_bias else None
    return linear(out, w.block(il, "attn_output.weight"), out_b)
