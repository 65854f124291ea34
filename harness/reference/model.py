"""``ReferenceModel`` and ``load_reference``: the public face of the reference forward."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import MappingProxyType

import numpy as np
from numpy.typing import NDArray

from harness.errors import FixtureError
from harness.reference.gemma2 import forward as gemma2_forward
from harness.reference.gguf_read import read_gguf
from harness.reference.glm4moe import forward as glm4moe_forward
from harness.reference.hparams import HParams, read_hparams
from harness.reference.llama import forward as llama_forward
from harness.reference.named_tensors import Weights
from harness.reference.ops import log_softmax

F64 = NDArray[np.float64]
Forward = Callable[[Weights, HParams, NDArray[np.intp]], F64]

#: ``general.architecture`` → the forward that mirrors llama.cpp's graph for it.
ARCHITECTURES: Mapping[str, Forward] = MappingProxyType(
    {"llama": llama_forward, "gemma2": gemma2_forward, "glm4moe": glm4moe_forward}
)


class ReferenceModel:
    """One GGUF model, dequantized, with a float64 causal forward pass."""

    def __init__(self, path: Path, hparams: HParams, weights: Weights, forward: Forward) -> None:
        self.path = path
        self.hparams = hparams
        self.weights = weights
        self._forward = forward
        self._n_vocab = int(weights.output().shape[0])

    @property
    def architecture(self) -> str:
        return self.hparams.architecture

    @property
    def n_vocab(self) -> int:
        return self._n_vocab

    def logits(self, tokens: Sequence[int]) -> F64:
        """``(len(tokens), n_vocab)``: row ``i`` is the next-token logits after ``tokens[:i+1]``."""
        ids = np.asarray(tokens, dtype=np.intp)
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError("tokens must be a non-empty sequence of token ids")
        n_embd_rows = self.weights.get("token_embd.weight").shape[0]
        bad = ids[(ids < 0) | (ids >= n_embd_rows)]
        if bad.size:
            raise ValueError(f"token ids outside 0..{n_embd_rows - 1}: {bad[:5].tolist()}")
        return self._forward(self.weights, self.hparams, ids)

    def log_probs(self, tokens: Sequence[int]) -> F64:
        """The log-softmax of ``logits(tokens)`` over the vocabulary."""
        return log_softmax(self.logits(tokens))


def load_reference(path: Path) -> ReferenceModel:
    """Read ``path`` once (metadata and every tensor dequantized) into a ReferenceModel.

    An architecture the reference does not implement, a missing required key or an
    unsupported feature raises a FixtureError naming the file.
    """
    contents = read_gguf(Path(path))
    forward = ARCHITECTURES.get(contents.architecture)
    if forward is None:
        raise FixtureError(
            f"{path}: architecture {contents.architecture!r} is not supported by the "
            f"reference model (it implements {', '.join(sorted(ARCHITECTURES))})"
        )
    hparams = read_hparams(contents)
    weights = Weights(contents.path, contents.architecture, contents.tensors)
    model = ReferenceModel(contents.path, hparams, weights, forward)
    # A one-token pass reads every tensor the graph needs, so a missing one fails here,
    # naming the file and the tensor, rather than in the middle of a comparison.
    model.logits([0])
    return model
