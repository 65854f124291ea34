"""Mixture-of-experts routing and the routed FFN: ``build_moe_ffn`` in src/llama-graph.cpp.

Routing per token, in llama.cpp's order:

1. ``logits = gate_inp · x`` (``ffn_moe_logits``);
2. ``probs``: softmax over all experts (``LLAMA_EXPERT_GATING_FUNC_TYPE_SOFTMAX``) or an
   elementwise sigmoid (``..._SIGMOID``);
3. selection scores = ``probs + exp_probs_b`` when the layer has that bias, else probs;
   the top ``n_expert_used`` by score are chosen (``ggml_argsort_top_k``);
4. the weights are the *unbiased* ``probs`` of the chosen experts;
5. ``norm_w``: divided by their sum, clamped below at 6.103515625e-5 (the smallest F16
   normal);
6. ``w_scale``: multiplied by it unless it is 0 or 1.

Then each chosen expert's SiLU-gated FFN (``ggml_swiglu_split``) is weighted and summed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from harness.reference.ffn import Activation, activate
from harness.reference.ops import linear, sigmoid, softmax

F64 = NDArray[np.float64]

#: ``ggml_clamp(weights_sum, 6.103515625e-5, INFINITY)`` in build_moe_ffn.
_MIN_WEIGHT_SUM = 6.103515625e-5


class Gating(enum.Enum):
    """``llama_expert_gating_func_type``: how router logits become probabilities."""

    SOFTMAX = "softmax"
    SIGMOID = "sigmoid"


@dataclass(frozen=True)
class Routing:
    """The routing recipe of one architecture's MoE layers."""

    gating: Gating
    n_expert: int
    n_expert_used: int
    norm_weights: bool
    weights_scale: float


def route(
    logits: F64, routing: Routing, bias: NDArray[np.floating] | None = None
) -> tuple[NDArray[np.intp], F64]:
    """``(selected, weights)``, each ``(T, n_expert_used)``, from router ``logits``
    ``(T, n_expert)``; ``selected`` is in descending order of selection score."""
    probs = softmax(logits) if routing.gating is Gating.SOFTMAX else sigmoid(logits)
    scores = probs if bias is None else probs + bias
    # A stable sort of the negated scores: highest first, ties to the lower index.
    selected = np.argsort(-scores, axis=-1, kind="stable")[:, : routing.n_expert_used]
    weights = np.take_along_axis(probs, selected, axis=-1)
    if routing.norm_weights:
        total = np.maximum(np.sum(weights, axis=-1, keepdims=True), _MIN_WEIGHT_SUM)
        weights = weights / total
    if routing.weights_scale not in (0.0, 1.0):
        weights = weights * routing.weights_scale
    return selected, weights


@dataclass(frozen=True)
class Experts:
    """Expert stacks in numpy order: gate/up ``(n_expert, n_ff, n_embd)``, down
    ``(n_expert, n_embd, n_ff)`` (``ffn_{gate,up,down}_exps``)."""

    gate: NDArray[np.floating]
    up: NDArray[np.floating]
    down: NDArray[np.floating]


def moe_ffn(
    x: F64,
    choice: tuple[NDArray[np.intp], F64],
    experts: Experts,
    act: Activation = Activation.SILU,
) -> F64:
    """Sum over each token's chosen experts of ``weight * down_e(act(gate_e x) * up_e x)``;
    ``choice`` is ``route``'s ``(selected, weights)``."""
    selected, weights = choice
    out = np.zeros((x.shape[0], experts.down.shape[1]), dtype=np.float64)
    for expert in np.unique(selected):
        rows, slots = np.nonzero(selected == expert)
        xe = x[rows]
        hidden = activate(linear(xe, experts.gate[expert]), act) * linear(xe, experts.up[expert])
        out[rows] += weights[rows, slots][:, None] * linear(hidden, experts.down[expert])
    return out
