"""Named tensor lookup with errors that name the file and the missing tensor."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from harness.errors import FixtureError
from harness.reference.ffn import FfnWeights
from harness.reference.moe import Experts

F32 = NDArray[np.float32]


class Weights:
    """The dequantized tensors of one GGUF file, by their GGUF names."""

    def __init__(self, path: Path, architecture: str, tensors: Mapping[str, F32]) -> None:
        self.path = path
        self.architecture = architecture
        self._tensors = dict(tensors)

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def get(self, name: str) -> F32:
        """The tensor ``name``; a FixtureError naming the file when it is absent."""
        tensor = self._tensors.get(name)
        if tensor is None:
            raise FixtureError(
                f"{self.path}: tensor {name} is missing, and the {self.architecture} "
                "reference needs it"
            )
        return tensor

    def optional(self, name: str) -> F32 | None:
        return self._tensors.get(name)

    def block(self, il: int, name: str) -> F32:
        """``blk.{il}.{name}`` (``name`` with its ``.weight``/``.bias`` suffix)."""
        return self.get(f"blk.{il}.{name}")

    def block_optional(self, il: int, name: str) -> F32 | None:
        return self.optional(f"blk.{il}.{name}")

    def output(self) -> F32:
        """``output.weight``, or ``token_embd.weight`` when absent (tied embeddings:
        ``TENSOR_DUPLICATED`` in each architecture's ``load_arch_tensors``)."""
        head = self.optional("output.weight")
        return self.get("token_embd.weight") if head is None else head


def dense_ffn(w: Weights, il: int, suffix: str = "") -> FfnWeights:
    """``blk.{il}.ffn_{gate,up,down}{suffix}.weight`` (suffix ``_shexp``: the shared expert)."""
    return FfnWeights(
        gate=w.block(il, f"ffn_gate{suffix}.weight"),
        up=w.block(il, f"ffn_up{suffix}.weight"),
        down=w.block(il, f"ffn_down{suffix}.weight"),
    )


def experts(w: Weights, il: int) -> Experts:
    """``blk.{il}.ffn_{gate,up,down}_exps.weight``."""
    return Experts(
        gate=w.block(il, "ffn_gate_exps.weight"),
        up=w.block(il, "ffn_up_exps.weight"),
        down=w.block(il, "ffn_down_exps.weight"),
    )
