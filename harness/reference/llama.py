"""The ``llama`` graph: ``llama_model_llama::graph`` in src/models/llama.cpp.

Per layer: ``x += attn(rms_norm(x) * attn_norm)`` with NORM RoPE (adjacent pairs) over
the whole head, ``rope_freqs.weight`` as per-pair frequency divisors when present
(``get_rope_factors``), kq scale ``1/sqrt(head_dim)``; then
``x += ffn(rms_norm(x) * ffn_norm)``, the FFN a SiLU-gated dense block (optional
``ffn_*.bias``) or, with ``ffn_gate_inp``, ``build_moe_ffn`` with softmax gating over all
experts, top-``expert_used_count``, the chosen weights renormalized (``norm_w = true``)
and no scale. Head: ``rms_norm * output_norm``, then ``output.weight`` or the tied
``token_embd.weight``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from harness.errors import FixtureError
from harness.reference.attention import kq_mask
from harness.reference.ffn import Activation, FfnWeights, gated_ffn
from harness.reference.hparams import HParams
from harness.reference.moe import moe_ffn, route
from harness.reference.named_tensors import Weights, experts
from harness.reference.ops import linear, rms_norm
from harness.reference.rope import rope_angles
from harness.reference.self_attention import AttentionCall, self_attention

F64 = NDArray[np.float64]


def forward(w: Weights, hp: HParams, tokens: NDArray[np.intp]) -> F64:
    """Logits ``(T, n_vocab)`` for every position of ``tokens``."""
    x = w.get("token_embd.weight")[tokens].astype(np.float64)
    n_tokens = len(tokens)
    call = AttentionCall(
        angles=rope_angles(
            np.arange(n_tokens), hp.n_rot, hp.rope_base, hp.rope_freq_scale,
            w.optional("rope_freqs.weight"),
        ),
        allowed=kq_mask(n_tokens),
        kq_scale=hp.attn_scale,
        out_bias=True,
    )
    for il in range(hp.n_layer):
        h = rms_norm(x, w.block(il, "attn_norm.weight"), hp.rms_eps)
        x = x + self_attention(w, hp, il, h, call)
        h = rms_norm(x, w.block(il, "ffn_norm.weight"), hp.rms_eps)
        x = x + _ffn(w, hp, il, h)
    x = rms_norm(x, w.get("output_norm.weight"), hp.rms_eps)
    return linear(x, w.output())


def _ffn(w: Weights, hp: HParams, il: int, h: F64) -> F64:
    if f"blk.{il}.ffn_gate_inp.weight" not in w:
        weights = FfnWeights(
            gate=w.block(il, "ffn_gate.weight"),
            up=w.block(il, "ffn_up.weight"),
            down=w.block(il, "ffn_down.weight"),
            gate_b=w.block_optional(il, "ffn_gate.bias"),
            up_b=w.block_optional(il, "ffn_up.bias"),
            down_b=w.block_optional(il, "ffn_down.bias"),
        )
        return gated_ffn(h, weights, Activation.SILU)
    if hp.routing is None:
        raise FixtureError(f"{w.path}: blk.{il}.ffn_gate_inp.weight without llama.expert_count")
    choice = route(linear(h, w.block(il, "ffn_gate_inp.weight")), hp.routing)
    return moe_ffn(h, choice, experts(w, il))
