"""Tensor values: seeded random weights, unit norms, and the "aligned token" trick.

Random weights make every speculative draft a miss. A spec with ``aligned_token`` gets
DESIGN's measured fix: one shared unit vector is added to every ``token_embd`` row and
the aligned token's ``output.weight`` row points along it, so the residual stream is
dominated by that vector and the model predicts that token after any context. Two models
aligned on the same token (target and drafter, or a trunk and its MTP head) then agree,
and the server reports ``draft_n_accepted`` > 0.
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np
import numpy.typing as npt

from harness.modelgen.rng import WeightRng
from harness.modelgen.specs import ModelShape
from harness.modelgen.tensors import TensorPlan
from harness.modelgen.vocab import Vocab

T = gguf.MODEL_TENSOR

#: Small enough that the aligned direction (length 1.0) dominates every residual stream.
WEIGHT_SCALE = 0.05

#: The shared unit vector is basis vector 0: exact in float32, no normalisation rounding.
_ALIGN_AXIS = 0

#: RMS-norm scales start at 1 (identity), as in a freshly initialised model.
_ONES = frozenset(
    {
        T.ATTN_NORM,
        T.ATTN_POST_NORM,
        T.FFN_NORM,
        T.FFN_PRE_NORM,
        T.FFN_POST_NORM,
        T.OUTPUT_NORM,
        T.NEXTN_ENORM,
        T.NEXTN_HNORM,
        T.NEXTN_SHARED_HEAD_NORM,
    }
)

#: The expert-selection bias starts at 0 so routing follows the router weights alone.
_ZEROS = frozenset({T.FFN_EXP_PROBS_B})

Array = npt.NDArray[np.float32]


def _aligned(plan: TensorPlan, value: Array, token_id: int) -> Array:
    if plan.kind == T.TOKEN_EMBD:
        value[:, _ALIGN_AXIS] += np.float32(1.0)
    elif plan.kind == T.OUTPUT:
        value[token_id, :] = 0.0
        value[token_id, _ALIGN_AXIS] = 1.0
    elif plan.kind == T.NEXTN_EH_PROJ:
        # eh_proj = [I/2 | I/2]: the MTP input is the mean of the normalised token
        # embedding and the normalised trunk state, both already along the shared axis.
        n = value.shape[0]
        half = np.eye(n, dtype=np.float32) * np.float32(0.5)
        value = np.concatenate([half, half], axis=1)
    return value


def build_weights(
    shape: ModelShape, vocab: Vocab, plans: list[TensorPlan]
) -> Iterator[tuple[str, Array]]:
    """Yield ``(name, float32 array)`` per plan, in plan order, from the spec's seed."""
    rng = WeightRng(shape.seed)
    token_id = vocab.token_id(shape.aligned_token) if shape.aligned_token else None
    for plan in plans:
        if plan.kind in _ONES:
            value: Array = np.ones(plan.shape, dtype=np.float32)
        elif plan.kind in _ZEROS:
            value = np.zeros(plan.shape, dtype=np.float32)
        else:
            # Drawn even when overwritten below, so one tensor's values never depend
            # on whether another is aligned.
            value = rng.uniform(plan.shape, WEIGHT_SCALE)
            if token_id is not None:
                value = _aligned(plan, value, token_id)
        yield plan.name, value
