"""Elementwise and row-wise operations of the graph, in float64.

Each is the exact function the named ggml op stands for; ggml's CPU shortcuts (the
fp16 GELU lookup table, ``GGML_GELU_FP16`` in ``ggml-cpu/vec.h``) are approximations of
these and show up only as small divergences.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]

#: ``GELU_COEF_A`` and ``SQRT_2_OVER_PI`` of ``ggml_gelu_f32`` (ggml-cpu/vec.h).
_GELU_COEF_A = 0.044715
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))


def rms_norm(x: F64, weight: NDArray[np.floating] | None, eps: float) -> F64:
    """``build_norm(..., LLM_NORM_RMS)``: ``ggml_rms_norm`` over the last axis, then ``* w``.

    ``x / sqrt(mean(x²) + eps)``; llama.cpp multiplies by the stored weight as is (the
    gemma converters already folded the ``1 +`` into it).
    """
    out: F64 = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return out if weight is None else out * weight


def silu(x: F64) -> F64:
    """``ggml_silu``: ``x * sigmoid(x)``."""
    return x * sigmoid(x)


def sigmoid(x: F64) -> F64:
    """``ggml_sigmoid``: ``1 / (1 + exp(-x))``."""
    return 1.0 / (1.0 + np.exp(-x))


def gelu_tanh(x: F64) -> F64:
    """``ggml_gelu`` (the tanh approximation): ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))``."""
    return 0.5 * x * (1.0 + np.tanh(_SQRT_2_OVER_PI * x * (1.0 + _GELU_COEF_A * x * x)))


def softcap(x: F64, cap: float) -> F64:
    """Gemma's soft-capping ``cap * tanh(x / cap)`` (scale, ``ggml_tanh``, scale)."""
    out: F64 = cap * np.tanh(x / cap)
    return out


def softmax(x: F64, axis: int = -1) -> F64:
    """``ggml_soft_max`` along ``axis``; ``-inf`` entries get probability 0."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    out: F64 = e / np.sum(e, axis=axis, keepdims=True)
    return out


def log_softmax(x: F64, axis: int = -1) -> F64:
    """``log(softmax(x))`` computed without forming the probabilities."""
    shifted = x - np.max(x, axis=axis, keepdims=True)
    out: F64 = shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return out


def linear(x: F64, weight: NDArray[np.floating], bias: NDArray[np.floating] | None = None) -> F64:
    """``build_lora_mm`` / ``ggml_mul_mat(W, x)`` with a numpy-order weight ``(out, in)``."""
    out: F64 = x @ weight.T.astype(np.float64)
    return out if bias is None else out + bias
