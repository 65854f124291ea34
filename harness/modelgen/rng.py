"""Seeded random weights that are bit-identical on every numpy version and machine.

numpy only promises a stable stream for a bit generator's raw output, not for
``Generator`` methods such as ``standard_normal`` (their algorithms may change between
releases). The recorded ``sha256.json`` must hold everywhere, so weights are built from
PCG64's raw 64-bit words with exact integer and power-of-two arithmetic only.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt


class WeightRng:
    """Uniform weights in ``[-scale, scale)`` from one PCG64 stream per fixture."""

    def __init__(self, seed: int) -> None:
        self._bits = np.random.PCG64(seed)

    def uniform(self, shape: tuple[int, ...], scale: float) -> npt.NDArray[np.float32]:
        count = int(np.prod(shape, dtype=np.int64))
        raw = np.asarray(self._bits.random_raw(count), dtype=np.uint64)
        # Top 24 bits -> an integer in [0, 2**24): exactly representable as float32, and the
        # scaling below is a power-of-two division, a multiply and a subtraction, each exact
        # or correctly rounded by IEEE 754, so every platform gets the same bits.
        ints = (raw >> np.uint64(40)).astype(np.float64)
        unit = ints / float(1 << 23) - 1.0  # [-1, 1)
        return (unit * scale).astype(np.float32).reshape(shape)
