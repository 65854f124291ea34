"""The gated feed-forward block: ``build_ffn(..., LLM_FFN_PAR)`` in src/llama-graph.cpp.

``down(act(gate(x)) * up(x))`` with ``act`` SiLU (``ggml_swiglu_split``: llama, glm4moe
and its shared expert) or tanh-GELU (``ggml_geglu_split``: gemma2); the activation is
applied to the gate projection, never to the up projection.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from harness.reference.ops import gelu_tanh, linear, silu

F64 = NDArray[np.float64]
B = NDArray[np.floating]


class Activation(enum.Enum):
    """``LLM_FFN_SILU`` or ``LLM_FFN_GELU``."""

    SILU = "silu"
    GELU = "gelu"


def activate(x: F64, act: Activation) -> F64:
    return silu(x) if act is Activation.SILU else gelu_tanh(x)


@dataclass(frozen=True)
class FfnWeights:
    """Numpy-order weights: gate/up ``(n_ff, n_embd)``, down ``(n_embd, n_ff)``; each bias
    is added right after its product (``build_ffn``'s ``*_b``)."""

    gate: B
    up: B
    down: B
    gate_b: B | None = None
    up_b: B | None = None
    down_b: B | None = None


def gated_ffn(x: F64, weights: FfnWeights, act: Activation) -> F64:
    """``down(act(gate x) * up x)`` for ``x`` ``(T, n_embd)``."""
    w = weights
    hidden = activate(linear(x, w.gate, w.gate_b), act) * linear(x, w.up, w.up_b)
    return linear(hidden, w.down, w.down_b)
