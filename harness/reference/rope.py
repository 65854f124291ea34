"""Rotary position embedding: ``ggml_rope_ext`` as the CPU backend computes it.

Ported from ``ggml_compute_forward_rope_flt``, ``ggml_rope_cache_init`` and
``rotate_pairs`` in ``ggml/src/ggml-cpu/ops.cpp``, without YaRN (``ext_factor`` 0,
``attn_factor`` 1): for pair ``i`` of the first ``n_rot`` dims of each head,
``theta_i = pos * freq_scale * base^(-2i/n_rot) / freq_factor_i``; dims past ``n_rot``
pass through unchanged.

- ``RopeType.NORM`` (``LLAMA_ROPE_TYPE_NORM``, mode 0): pair ``i`` is the adjacent dims
  ``(2i, 2i+1)``.
- ``RopeType.NEOX`` (``LLAMA_ROPE_TYPE_NEOX``, mode 2): pair ``i`` is ``(i, i + n_rot/2)``.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence

import numpy as np
from numpy.typing import NDArray

F64 = NDArray[np.float64]


class RopeType(enum.Enum):
    """Which dims of a head form a rotated pair (``llama_model_rope_type``)."""

    NORM = "norm"
    NEOX = "neox"


def rope_angles(
    positions: Sequence[int] | NDArray[np.integer],
    n_rot: int,
    base: float,
    freq_scale: float = 1.0,
    freq_factors: NDArray[np.floating] | None = None,
) -> F64:
    """``theta[pos, i]`` for ``i < n_rot/2`` (``ggml_rope_cache_init`` + ``rope_yarn``)."""
    if n_rot % 2:
        raise ValueError(f"n_rot must be even, not {n_rot}")
    inv_freq = base ** (-2.0 * np.arange(n_rot // 2, dtype=np.float64) / n_rot)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, dtype=np.float64)[: n_rot // 2]
    pos = np.asarray(positions, dtype=np.float64)
    angles: F64 = freq_scale * pos[:, None] * inv_freq[None, :]
    return angles


def apply_rope(x: F64, angles: F64, kind: RopeType) -> F64:
    """Rotate ``x`` ``(n_tokens, n_heads, head_dim)`` by ``angles`` ``(n_tokens, n_rot/2)``."""
    half = angles.shape[1]
    n_rot = 2 * half
    cos = np.cos(angles)[:, None, :]
    sin = np.sin(angles)[:, None, :]
    out = x.copy()
    if kind is RopeType.NORM:
        x0, x1 = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        out[..., 0:n_rot:2] = x0 * cos - x1 * sin
        out[..., 1:n_rot:2] = x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., :half], x[..., half:n_rot]
        out[..., :half] = x0 * cos - x1 * sin
        out[..., half:n_rot] = x0 * sin + x1 * cos
    return out
