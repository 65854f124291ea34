"""Causal self-attention over a whole sequence: the KQ mask and ``build_attn_mha``.

The mask is ``llama_kv_cache::set_input_kq_mask`` (src/llama-kv-cache.cpp): a key at
position ``p0`` is hidden from the query at ``p1`` when ``p0 > p1`` (causal) and, on a
sliding-window layer, when ``llama_hparams::is_masked_swa`` says so (src/llama-hparams.h,
``LLAMA_SWA_TYPE_STANDARD``): ``p1 - p0 >= n_swa``. So a window of ``n_swa`` sees the
query itself and the ``n_swa - 1`` keys before it; a key at distance ``== n_swa`` is
masked.

``attention`` is ``build_attn_mha`` (src/llama-graph.cpp): grouped-query heads (query
head ``h`` reads KV head ``h // (n_head / n_head_kv)``, ggml's broadcast in mul_mat and
flash attention), ``kq = q·k * kq_scale``, the optional soft-cap
``cap * tanh(kq / cap)``, the mask, softmax over keys, then ``softmax · v``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from harness.reference.ops import softcap as _softcap
from harness.reference.ops import softmax

F64 = NDArray[np.float64]


def kq_mask(n_tokens: int, sliding_window: int | None = None) -> NDArray[np.bool_]:
    """``allowed[p1, p0]``: may the query at ``p1`` see the key at ``p0`` (positions 0..n-1)."""
    p1 = np.arange(n_tokens)[:, None]
    p0 = np.arange(n_tokens)[None, :]
    allowed = p0 <= p1
    if sliding_window is not None:
        allowed &= (p1 - p0) < sliding_window
    mask: NDArray[np.bool_] = allowed
    return mask


def attention(
    q: F64,
    k: F64,
    v: F64,
    *,
    kq_scale: float,
    allowed: NDArray[np.bool_],
    softcap: float | None = None,
) -> F64:
    """``q`` ``(T, n_head, d)``, ``k``/``v`` ``(T, n_head_kv, d)`` → ``(T, n_head * d_v)``."""
    n_tokens, n_head, _ = q.shape
    n_head_kv = k.shape[1]
    group = n_head // n_head_kv
    kh = np.repeat(k.transpose(1, 0, 2), group, axis=0)  # (n_head, T, d)
    vh = np.repeat(v.transpose(1, 0, 2), group, axis=0)
    qh = q.transpose(1, 0, 2)
    kq = np.matmul(qh, kh.transpose(0, 2, 1)) * kq_scale  # (n_head, T_q, T_k)
    if softcap is not None:
        kq = _softcap(kq, softcap)
    kq = np.where(allowed[None, :, :], kq, -np.inf)
    probs = softmax(kq, axis=-1)
    out = np.matmul(probs, vh)  # (n_head, T, d_v)
    result: F64 = out.transpose(1, 0, 2).reshape(n_tokens, n_head * v.shape[2])
    return result
