"""Less variance per pair from what is known before the pair: a CUPED-style covariate (pure).

CUPED (Deng et al., WSDM 2013) subtracts from each observation the part a covariate
predicts, with ``theta = cov(x, y) / var(x)``; when the covariate cannot depend on the
treatment the variance shrinks by the share of it the covariate explains
(``corr(x, y)^2``). Here each observation is a pair's log ratio and each covariate's
expectation is 0 by the design's coin flips, so ``y - theta * x`` is subtracted (the
regression estimate at x = 0: both arms in the same slot, on a machine of the same
speed), which also takes out this sample's imbalance of the covariate.

Two covariates, alone or together (an ordinary least-squares fit of both). The first is
the pair's slot, fixed by the design's coin flips before the pair runs: +1 when the
candidate ran first (sequential, interleaved) or got the first half of the cores (duet),
-1 otherwise. Whatever favours the first start of a pair (a page
cache the first one warmed, a frequency boost that fades) or one half of the cores
(interrupts land on core 0) then stops widening the interval: the coin already keeps
it from biasing the ratio, the covariate takes it out of the spread too. A build cannot
move its slot, so the adjustment cannot move a real change.

The second is the machine's own speed around each start: the log ratio of a fixed loop's
speed this process ran on the candidate's cores and on the baseline's
(harness/ab/machine_speed.py). Where the VM's speed moves between a pair's two starts,
both the loop and the server see it; the build cannot move the loop.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from harness.ab.design import BASELINE, CANDIDATE, Sample

#: ``--covariate`` values: none, the pair's slot, the machine's speed around each start
#: (harness/ab/machine_speed.py), or both.
NO_COVARIATE = "none"
SLOT_COVARIATE = "slot"
MACHINE_COVARIATE = "machine"
BOTH_COVARIATES = "slot+machine"
COVARIATES = (NO_COVARIATE, SLOT_COVARIATE, MACHINE_COVARIATE, BOTH_COVARIATES)
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


def machine_covariate(samples: Sequence[Sample], metric: str) -> list[float] | None:
    """Each complete pair's log ratio of the machine's speed (candidate over baseline), as
    :func:`slot_covariate` orders them; None where a start has no reading."""
    by_pair: dict[int, dict[str, Sample]] = {}
    for sample in samples:
        if metric in sample.values:
            by_pair.setdefault(sample.pair, {})[sample.arm] = sample
    ratios = []
    for pair in sorted(by_pair):
        arms = by_pair[pair]
        if BASELINE not in arms or CANDIDATE not in arms:
            continue
        ratio = machine_ratio(arms[BASELINE].machine, arms[CANDIDATE].machine)
        if ratio is None:
            return None
        ratios.append(ratio)
    return ratios


def machine_ratio(baseline: float | None, candidate: float | None) -> float | None:
    """One pair's machine covariate: the log ratio of the machine's speed around the
    candidate's start over the baseline's (None: a start without a reading)."""
    if baseline is None or candidate is None or baseline <= 0 or candidate <= 0:
        return None
    return math.log(candidate) - math.log(baseline)


def covariates_for(name: str, samples: Sequence[Sample],
                   metric: str) -> list[list[float]] | None:
    """The covariate columns ``--covariate name`` adjusts ``metric``'s pairs by (None:
    none, or the machine's speed was not read)."""
    return chosen_columns(name, lambda: slot_covariate(samples, metric),
                          lambda: machine_covariate(samples, metric))


def chosen_columns(name: str, slots: Callable[[], list[float]],
                   machine: Callable[[], list[float] | None]) -> list[list[float]] | None:
    """The columns ``--covariate name`` takes, of a pair list's slot column and machine
    column (each read only when named; None: none, or no machine column)."""
    columns = []
    if name in (SLOT_COVARIATE, BOTH_COVARIATES):
        columns.append(slots())
    if name in (MACHINE_COVARIATE, BOTH_COVARIATES):
        read = machine()
        if read is None:
            return None
        columns.append(read)
    return columns or None


def adjust(log_ratios: Sequence[float], columns: Sequence[Sequence[float]]) -> Adjusted:
    """``log_ratios`` less the part the covariate ``columns`` (each one value per pair)
    explain (CUPED, least squares). Left as they are with fewer than
    :data:`MIN_ADJUSTED_PAIRS` pairs, or covariates that do not vary. ``theta`` is the
    first column's coefficient."""
    for column in columns:
        if len(column) != len(log_ratios):
            raise ValueError(f"a covariate needs one value per pair: {len(column)} for "
                             f"{len(log_ratios)} pairs")
    raw = tuple(log_ratios)
    if len(raw) < MIN_ADJUSTED_PAIRS or not columns:
        return Adjusted(raw, 0.0, 1.0)
    y_mean = statistics.fmean(raw)
    var_y = sum((y - y_mean) ** 2 for y in raw)
    # Columns that do not vary explain nothing (and would make the fit singular).
    varying = [list(column) for column in columns
               if any(x != column[0] for x in column)]
    if var_y == 0 or not varying:
        return Adjusted(raw, 0.0, 1.0)
    centred = [[x - statistics.fmean(column) for x in column] for column in varying]
    thetas = _least_squares(centred, [y - y_mean for y in raw])
    # The fit is centred, the subtraction is not: each covariate's expectation is 0 by
    # the design's coin flips, so what is taken out is theta * x itself — the pairs'
    # imbalance (more candidates first than baselines, a machine faster on the
    # candidates' side this time) as well as the spread it causes. Taking out only
    # theta * (x - mean x) would leave that imbalance in the estimate while the
    # interval, narrowed, no longer counted its noise: A/A pairs with a 10 % machine
    # spread then alarmed 13 % of the time (tests/test_ab_stats.py).
    adjusted = tuple(y - sum(t * column[i] for t, column in zip(thetas, varying, strict=True))
                     for i, y in enumerate(raw))
    a_mean = statistics.fmean(adjusted)
    share = sum((a - a_mean) ** 2 for a in adjusted) / var_y
    return Adjusted(adjusted, thetas[0], share)


def _least_squares(columns: list[list[float]], target: list[float]) -> list[float]:
    """The coefficients of centred ``columns`` best predicting ``target``: the normal
    equations, solved by Gaussian elimination (one or two columns here). A column the
    others already explain gets 0."""
    k = len(columns)
    gram = [[sum(a * b for a, b in zip(columns[i], columns[j], strict=True))
             for j in range(k)] for i in range(k)]
    rhs = [sum(a * y for a, y in zip(columns[i], target, strict=True)) for i in range(k)]
    for col in range(k):
        pivot = gram[col][col]
        if abs(pivot) < 1e-12:
            gram[col] = [0.0] * k
            rhs[col] = 0.0
            continue
        for row in range(col + 1, k):
            factor = gram[row][col] / pivot
            gram[row] = [a - factor * b for a, b in zip(gram[row], gram[col], strict=True)]
            rhs[row] -= factor * rhs[col]
    thetas = [0.0] * k
    for row in range(k - 1, -1, -1):
        pivot = gram[row][row]
        if abs(pivot) < 1e-12:
            continue
        thetas[row] = (rhs[row] - sum(gram[row][j] * thetas[j]
                                      for j in range(row + 1, k))) / pivot
    return thetas
