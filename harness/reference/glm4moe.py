"""The ``glm4moe`` trunk: ``llama_model_glm4_moe::graph`` in src/models/glm4-moe.cpp.

Only the first ``block_count - nextn_predict_layers`` blocks run (the trailing MTP blocks
belong to ``graph_mtp``). Per layer: ``x += attn(rms_norm(x) * attn_norm)`` with the
optional Q/K biases, the optional per-head ``attn_q_norm``/``attn_k_norm`` before RoPE,
NEOX RoPE over the first ``rope.dimension_count`` dims of each ``attention.key_length``
head (the rest pass through), kq scale ``1/sqrt(head_dim)``; then
``h = rms_norm(x) * post_attention_norm`` (glm4moe has no ffn_norm) and
``x += ffn(h)``: a SiLU-gated dense block for the first ``leading_dense_block_count``
layers, else ``build_moe_ffn`` (sigmoid gating, selection on ``sigmoid + exp_probs_b``,
weights from the unbiased sigmoid, ``expert_weights_norm``, ``expert_weights_scale``)
plus the shared expert's SiLU-gated FFN on the same ``h``. Head: ``rms_norm *
output_norm``, ``output.weight`` or the tied ``token_embd.weight``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from harness.errors import FixtureError
from harness.reference.attention import kq_mask
from harness.reference.ffn import Activation, gated_ffn
from harness.reference.hparams import HParams
from harness.reference.moe import moe_ffn, route
from harness.reference.named_tensors import Weights, dense_ffn, experts
from harness.reference.ops import linear, rms_norm
from harness.reference.rope import rope_angles
from harness.reference.self_attention import AttentionCall, self_attention

F64 = NDArray[np.float64]


def forward(w: Weights, hp: HParams, tokens: NDArray[np.intp]) -> F64:
    """Logits ``(T, n_vocab)`` for every position of ``tokens``."""
    x = w.get("token_embd.weight")[tokens].astype(np.float64)
    n_tokens = len(tokens)
    call = AttentionCall(
        angles=rope_angles(np.arange(n_tokens), hp.n_rot, hp.rope_base, hp.rope_freq_scale),
        allowed=kq_mask(n_tokens),
        kq_scale=hp.attn_scale,
        qk_norm=True,
    )
    for il in range(hp.n_layer):
        h = rms_norm(x, w.block(il, "attn_norm.weight"), hp.rms_eps)
        x = x + self_attention(w, hp, il, h, call)
        h = rms_norm(x, w.block(il, "post_attention_norm.weight"), hp.rms_eps)
        x = x + _ffn(w, hp, il, h)
    x = rms_norm(x, w.get("output_norm.weight"), hp.rms_eps)
    return linear(x, w.output())


def _ffn(w: Weights, hp: HParams, il: int, h: F64) -> F64:
    if il < hp.n_layer_dense_lead:
        return gated_ffn(h, dense_ffn(w, il), Activation.SILU)
    if hp.routing is None:
        raise FixtureError(f"{w.path}: glm4moe block {il} is MoE but the file has no routing")
    choice = route(
        linear(h, w.block(il, "ffn_gate_inp.weight")),
        hp.routing,
        w.block(il, "exp_probs_b.bias"),
    )
    routed = moe_ffn(h, choice, experts(w, il))
    if f"blk.{il}.ffn_gate_shexp.weight" not in w:
        return routed
    return routed + gated_ffn(h, dense_ffn(w, il, "_shexp"), Activation.SILU)
