"""Less variance per pair from what is known before the pair: a CUPED-style covariate (pure).

CUPED (Deng et al., WSDM 2013) subtracts from each observation the part a covariate
predicts, ``y - theta * (x - mean(x))`` with ``theta = cov(x, y) / var(x)``; when the
covariate cannot depend on the treatment its mean effect is untouched and the variance
shrinks by the share of it the covariate explains (``corr(x, y)^2``).

The covariate here is the pair's slot, fixed by the design's coin flips before the pair
runs: +1 when the candidate ran first (sequential, interleaved) or got the first half
of the cores (duet), -1 otherwise. Whatever favours the first start of a pair (a page
cache the first one warmed, a frequency boost that fades) or one half of the cores
(interrupts land on core 0) then stops widening the interval: the coin already keeps
it from biasing the ratio, the covariate takes it out of the spread too. A build cannot
move its slot, so the adjustment cannot move a real change.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.ab.design import BASELINE, CANDIDATE, Sample

#: ``--covariate`` values: none, or the pair's slot.
NO_COVARIATE = "none"
SLOT_COVARIATE = "slot"
COVARIATES = (NO_COVARIATE, SLOT_COVARIATE)
#: Fewer pairs than this are left unadjusted: theta from a handful of pairs adds more
#: noise than it takes out.
MIN_ADJUSTED_PAIRS = 8


@dataclass(frozen=True)
class Adjusted:
    """Log ratios with the covariate's share taken out, and how much it took."""

    log_ratios: tuple[float, ...]
    theta: float
    #: The variance of the adjusted log ratios over the raw ones' (1: no gain).
    variance_share: float


def slot_covariate(samples: Sequence[Sample], metric: str) -> list[float]:
    """Each complete pair's slot (+1: the candidate first, or on the first half of the
    cores when the pair ran at once on opposite halves; -1 otherwise), in the order and
    with the pairs :func:`harness.ab.design.paired_values` gives for ``metric``."""
    by_pair: dict[int, dict[str, Sample]] = {}
    for sample in samples:
        if metric in sample.values:
            by_pair.setdefault(sample.pair, {})[sample.arm] = sample
    slots = []
    for pair in sorted(by_pair):
        arms = by_pair[pair]
        if BASELINE not in arms or CANDIDATE not in arms:
            continue
        base, cand = arms[BASELINE], arms[CANDIDATE]
        slots.append(slot_of(base.sequence, cand.sequence, base.half, cand.half))
    return slots


def slot_of(baseline_sequence: int, candidate_sequence: int, baseline_half: int | None,
            candidate_half: int | None) -> float:
    """One pair's slot from its two starts' places: +1 when the candidate had the first
    half of the cores (a pair run at once on opposite halves) or ran first; else -1."""
    if baseline_half is not None and candidate_half is not None \
            and baseline_half != candidate_half:
        return 1.0 if candidate_half == 0 else -1.0
    return 1.0 if candidate_sequence < baseline_sequence else -1.0


def adjust(log_ratios: Sequence[float], covariate: Sequence[float]) -> Adjusted:
    """``log_ratios`` less the part ``covariate`` explains (CUPED). Left as they are with
    fewer than :data:`MIN_ADJUSTED_PAIRS` pairs, or a covariate that does not vary."""
    if len(log_ratios) != len(covariate):
        raise ValueError(f"a covariate needs one value per pair: {len(covariate)} for "
                         f"{len(log_ratios)} pairs")
    raw = tuple(log_ratios)
    if len(raw) < MIN_ADJUSTED_PAIRS:
        return Adjusted(raw, 0.0, 1.0)
    x_mean, y_mean = statistics.fmean(covariate), statistics.fmean(raw)
    var_x = sum((x - x_mean) ** 2 for x in covariate)
    var_y = sum((y - y_mean) ** 2 for y in raw)
    if var_x == 0 or var_y == 0:
        return Adjusted(raw, 0.0, 1.0)
    theta = sum((x - x_mean) * (y - y_mean)
                for x, y in zip(covariate, raw, strict=True)) / var_x
    adjusted = tuple(y - theta * (x - x_mean) for x, y in zip(covariate, raw, strict=True))
    a_mean = statistics.fmean(adjusted)
    share = sum((a - a_mean) ** 2 for a in adjusted) / var_y
    return Adjusted(adjusted, theta, share)
