"""Tensor values: seeded random weights, unit norms, and the "aligned token" trick.

Random weights make every speculative draft a miss. A spec with ``aligned_token`` gets
docs/design.md's measured fix: one shared unit vector is added to every ``token_embd`` row and
the aligned token's ``output.weight`` row points along it, so the residual stream is
dominated by that vector and the model predicts that token after any context. Two models
aligned on the same token (target and drafter, or a trunk and its MTP head) then agree,
and the server reports ``draft_n_accepted`` > 0.

The ``peaked`` profile (for output-correctness checks) draws every matrix with a
standard deviation of ``1/sqrt(fan_in)``, so each block's output is as large as its
input and the context moves the prediction, and scales ``output.weight`` so a logit has
a standard deviation of ``PEAKED_LOGIT_STD``: next-token distributions then have a few
nats of entropy and a clear top token, like a trained model's, instead of the flat
profile's nearly uniform ones (top log-probability about -3.9 over 269 tokens). Its
norm scales are drawn around 1 rather than set to 1, so a build that drops or misreads
one computes a different number. A model whose logits reuse ``token_embd`` (gemma2)
scores every token by its embedding's dot product with the last state, which holds the
input token's own embedding: its embedding rows are sized for the logits' spread and
its post-norms scaled up so the blocks, not the input token, dominate that state
(otherwise it repeats its input token with probability 1, measured).
"""

from __future__ import annotations

from collections.abc import Iterator

import gguf
import numpy as np
import numpy.typing as npt

from harness.modelgen.rng import WeightRng
from harness.modelgen.specs import ModelShape, WeightProfile
from harness.modelgen.tensors import TensorPlan
from harness.modelgen.vocab import Vocab

T = gguf.MODEL_TENSOR

#: Small enough that the aligned direction (length 1.0) dominates every residual stream.
WEIGHT_SCALE = 0.05

#: The spread of a peaked model's logits: exp(+-3 std) spans e^18 between a likely and an
#: unlikely token, a distribution of a few nats over the fixtures' 269 tokens.
PEAKED_LOGIT_STD = 3.0
#: Peaked norm scales lie in 1 ± this; a tied model's post-norms in POST_NORM_GAIN ± it.
_NORM_SPREAD = 0.25
_POST_NORM_GAIN = 8.0
_POST_NORMS = frozenset({T.ATTN_POST_NORM, T.FFN_POST_NORM})
#: A uniform draw in [-a, a) has standard deviation a/sqrt(3).
_UNIFORM_STD = 1.0 / 3.0 ** 0.5

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
        T.ATTN_Q_NORM,
        T.ATTN_K_NORM,
        T.PER_LAYER_PROJ_NORM,
        T.PER_LAYER_POST_NORM,
    }
)
#: RoPE frequency factors of 1 leave the rotation as the base frequency sets it.
_UNIT_FACTORS = frozenset({T.ROPE_FREQS})

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


def _peaked_scale(plan: TensorPlan, tied: bool) -> float:
    """The half-width of a peaked matrix's uniform draw (see the module docstring)."""
    fan_in = plan.shape[-1]
    if plan.kind == T.TOKEN_EMBD and not tied:
        return 1.0  # rows of unit-order values; the first norm rescales them anyway
    # After the final RMS norm each of the fan_in inputs has RMS 1.
    target_std = PEAKED_LOGIT_STD if plan.kind in (T.OUTPUT, T.TOKEN_EMBD) else 1.0
    return float(target_std / (fan_in ** 0.5) / _UNIFORM_STD)


def build_weights(
    shape: ModelShape, vocab: Vocab, plans: list[TensorPlan]
) -> Iterator[tuple[str, Array]]:
    """Yield ``(name, float32 array)`` per plan, in plan order, from the spec's seed."""
    rng = WeightRng(shape.seed)
    token_id = vocab.token_id(shape.aligned_token) if shape.aligned_token else None
    peaked = shape.weights is WeightProfile.PEAKED
    tied = not any(plan.kind == T.OUTPUT for plan in plans)
    for plan in plans:
        value: Array
        if plan.kind in _UNIT_FACTORS:
            value = np.ones(plan.shape, dtype=np.float32)
        elif peaked and plan.kind in _ONES:
            gain = _POST_NORM_GAIN if tied and plan.kind in _POST_NORMS else 1.0
            value = rng.uniform(plan.shape, _NORM_SPREAD) + np.float32(gain)
        elif plan.kind in _ONES:
            value = np.ones(plan.shape, dtype=np.float32)
        elif plan.kind in _ZEROS:
            value = np.zeros(plan.shape, dtype=np.float32)
        else:
            # Drawn even when overwritten below, so one tensor's values never depend
            # on whether another is aligned.
            scale = _peaked_scale(plan, tied) if peaked else WEIGHT_SCALE
            value = rng.uniform(plan.shape, scale)
            if token_id is not None:
                value = _aligned(plan, value, token_id)
        yield plan.name, value
