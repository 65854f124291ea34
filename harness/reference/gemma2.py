"""The ``gemma2`` graph: ``llama_model_gemma2::graph`` in src/models/gemma2.cpp.

Embeddings scaled by ``sqrt(n_embd)``; per layer: ``a = attn(rms_norm(x) * attn_norm)``
with NEOX RoPE (pairs ``i, i + n_rot/2``; the SWA layers' base ``rope.freq_base_swa``),
Q scaled by ``f_attention_scale`` after RoPE and kq scale 1, the attention logits
soft-capped (``attn_logit_softcapping``; flash attention's ``logit_softcap``), the
sliding-window mask on the layers ``set_swa_pattern`` marks;
``x += rms_norm(a) * post_attention_norm``; ``f = geglu_ffn(rms_norm(x) * ffn_norm)``
(tanh-GELU on the gate); ``x += rms_norm(f) * post_ffw_norm``. Head: ``rms_norm *
output_norm``, the tied ``token_embd.weight``, then ``final_logit_softcapping``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

from harness.reference.attention import kq_mask
from harness.reference.ffn import Activation, gated_ffn
from harness.reference.hparams import HParams
from harness.reference.named_tensors import Weights, dense_ffn
from harness.reference.ops import linear, rms_norm, softcap
from harness.reference.rope import rope_angles
from harness.reference.self_attention import AttentionCall, self_attention

F64 = NDArray[np.float64]


def forward(w: Weights, hp: HParams, tokens: NDArray[np.intp]) -> F64:
    """Logits ``(T, n_vocab)`` for every position of ``tokens``."""
    x = w.get("token_embd.weight")[tokens].astype(np.float64) * math.sqrt(hp.n_embd)
    n_tokens = len(tokens)
    positions = np.arange(n_tokens)
    calls = {
        swa: AttentionCall(
            angles=rope_angles(
                positions, hp.n_rot, hp.rope_base_swa if swa else hp.rope_base,
                hp.rope_freq_scale,
            ),
            allowed=kq_mask(n_tokens, hp.sliding_window if swa else None),
            kq_scale=1.0,
            q_scale=hp.attn_scale,
            softcap=hp.attn_softcap,
        )
        for swa in (False, True)
    }
    for il in range(hp.n_layer):
        h = rms_norm(x, w.block(il, "attn_norm.weight"), hp.rms_eps)
        a = self_attention(w, hp, il, h, calls[hp.swa_layers[il]])
        x = x + rms_norm(a, w.block(il, "post_attention_norm.weight"), hp.rms_eps)
        h = rms_norm(x, w.block(il, "ffn_norm.weight"), hp.rms_eps)
        f = gated_ffn(h, dense_ffn(w, il), Activation.GELU)
        x = x + rms_norm(f, w.block(il, "post_ffw_norm.weight"), hp.rms_eps)
    x = rms_norm(x, w.get("output_norm.weight"), hp.rms_eps)
    # gemma2 always reads token_embd as its output (load_arch_tensors: TENSOR_DUPLICATED).
    logits = linear(x, w.get("token_embd.weight"))
    return logits if hp.final_softcap is None else softcap(logits, hp.final_softcap)
