"""Confidence intervals for the A/B gate: paired ratios of two builds, and rates.

Pure arithmetic: no I/O and no randomness, so the same samples always give the same
interval and a gate's verdict can be recomputed from the samples it recorded.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from functools import lru_cache

#: Up to this many pairs the signed-rank null distribution is counted exactly. Beyond
#: it the normal approximation with continuity correction is used: it is within a rank
#: of the exact value there, and the exact count grows with the cube of n.
EXACT_MAX_PAIRS = 200


@dataclass(frozen=True)
class RatioInterval:
    """candidate / baseline: a point estimate and its confidence interval.

    ``ratio`` > 1 means the candidate's figure is larger (faster for tokens/s, slower
    for a time). ``confidence`` is the level asked for; the exact interval's coverage
    is at least that (the signed-rank distribution is discrete).
    """

    ratio: float
    low: float
    high: float
    confidence: float
    pairs: int


def z_quantile(p: float) -> float:
    """The standard normal quantile (scipy is not a dependency; the stdlib has it)."""
    return statistics.NormalDist().inv_cdf(p)


def _check_confidence(confidence: float) -> None:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence {confidence} must be between 0 and 1, exclusive "
                         "(0.95 is 95 %)")


def _tail(confidence: float) -> Fraction:
    """The probability each side of a two-sided interval may leave out, exactly."""
    return (1 - Fraction(confidence)) / 2


@lru_cache(maxsize=1024)
def _exact_lower_critical(n: int, confidence: float) -> int | None:
    tail = _tail(confidence)
    # The critical value lies below the mean n(n+1)/4, so sums above it are never needed.
    cap = n * (n + 1) // 4
    # counts[s]: how many subsets of the ranks seen so far sum to s (W+ = s when exactly
    # those ranks are positive; under the null each of the 2^n subsets is equally likely).
    counts = [1] + [0] * cap
    for rank in range(1, n + 1):
        if rank > cap:
            break
        # Each subset leaves ``rank`` out (counts[s]) or takes it (counts[s - rank]).
        counts = counts[:rank] + [a + b for a, b in zip(counts[rank:], counts, strict=False)]
    total = 2 ** n
    cumulative = 0
    critical = None
    for t, count in enumerate(counts):
        cumulative += count
        # cumulative / total > tail, in integers so a tie at the boundary is exact.
        if cumulative * tail.denominator > tail.numerator * total:
            break
        critical = t
    return critical


def _normal_lower_critical(n: int, confidence: float) -> int | None:
    mean = n * (n + 1) / 4
    sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24)
    z = z_quantile(1 - (1 - confidence) / 2)
    # P(W+ <= t) ~ Phi((t + 0.5 - mean) / sd) <= tail  <=>  t <= mean - z sd - 0.5.
    critical = math.floor(mean - z * sd - 0.5)
    return critical if critical >= 0 else None


def signed_rank_lower_critical(n: int, confidence: float = 0.95) -> int | None:
    """The Wilcoxon signed-rank lower critical value T for ``n`` pairs, two-sided.

    The largest T with P(W+ <= T) <= (1 - confidence) / 2 under the null (the table
    value: 8 for n = 10 and 52 for n = 20 at 95 %). None when even T = 0 is more
    likely than that, i.e. ``n`` pairs cannot reach the confidence.
    """
    _check_confidence(confidence)
    if n < 1:
        return None
    if n <= EXACT_MAX_PAIRS:
        return _exact_lower_critical(n, confidence)
    return _normal_lower_critical(n, confidence)


def min_pairs_for(confidence: float = 0.95) -> int:
    """The fewest pairs whose signed-rank interval reaches ``confidence`` (6 at 95 %)."""
    _check_confidence(confidence)
    tail = _tail(confidence)
    n = 1
    # P(W+ <= 0) = 2^-n: the interval exists once that is within the tail.
    while tail.denominator > tail.numerator * 2 ** n:
        n += 1
    return n


def _log_sample(value: float, arm: str, index: int) -> float:
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{arm} sample {index} is {value!r}: a paired ratio needs "
                         "finite values above 0")
    return math.log(value)


def paired_ratio_interval(baseline: Sequence[float], candidate: Sequence[float],
                          confidence: float = 0.95) -> RatioInterval | None:
    """candidate / baseline over pairs (baseline[i], candidate[i]), with its interval.

    Works on the log ratios d_i = ln(candidate_i) - ln(baseline_i). The estimate is
    the Hodges-Lehmann median of the Walsh averages (d_i + d_j) / 2, i <= j; the
    interval runs from the (T+1)-th smallest to the (T+1)-th largest Walsh average,
    T the signed-rank critical value (:func:`signed_rank_lower_critical`). Both are
    exponentiated back to ratios.

    Why this method: the interval is exact for any continuous distribution of d
    symmetric about its centre (no normality assumed, which timings lack); a single
    outlier pair (a server start that hit a cold cache) moves it by at most one Walsh
    rank, not by its size as it would a mean; and it is deterministic, unlike a
    bootstrap, so a verdict is reproducible from its samples. Logs make the ratio
    symmetric: swapping the arms inverts the interval exactly.

    None when there are too few pairs for ``confidence`` (fewer than 6 at 95 %).
    Raises ValueError naming the first sample that is not finite and above 0, or when
    the arms differ in length.
    """
    _check_confidence(confidence)
    if len(baseline) != len(candidate):
        raise ValueError(f"paired samples need as many baseline values "
                         f"({len(baseline)}) as candidate values ({len(candidate)})")
    logs_b = [_log_sample(v, "baseline", i) for i, v in enumerate(baseline)]
    logs_c = [_log_sample(v, "candidate", i) for i, v in enumerate(candidate)]
    # A difference of logs, not the log of a quotient: then swapping the arms negates
    # every d exactly, and the interval inverts exactly.
    return log_ratio_interval([c - b for b, c in zip(logs_b, logs_c, strict=True)],
                              confidence)


def log_ratio_interval(diffs: Sequence[float],
                       confidence: float = 0.95) -> RatioInterval | None:
    """:func:`paired_ratio_interval` from the pairs' log ratios themselves (for log
    ratios a covariate adjusted: harness/ab/covariate.py). None below the pairs
    ``confidence`` needs."""
    _check_confidence(confidence)
    n = len(diffs)
    critical = signed_rank_lower_critical(n, confidence)
    if critical is None:
        return None
    walsh = sorted((diffs[i] + diffs[j]) / 2 for i in range(n) for j in range(i, n))
    return RatioInterval(ratio=math.exp(statistics.median(walsh)),
                         low=math.exp(walsh[critical]), high=math.exp(walsh[-1 - critical]),
                         confidence=confidence, pairs=n)


def wilson_interval(successes: int, trials: int,
                    confidence: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of a rate: sound at 0 successes, unlike the Wald one.

    A false-alarm benchmark mostly sees 0 or a few alarms, where ``p ± z·se`` collapses
    to a zero-width interval.
    """
    _check_confidence(confidence)
    if trials < 1:
        raise ValueError(f"a rate needs at least one trial, not {trials}")
    if not 0 <= successes <= trials:
        raise ValueError(f"successes {successes} must be between 0 and trials ({trials})")
    z = z_quantile(1 - (1 - confidence) / 2)
    z2 = z * z
    p = successes / trials
    denominator = 1 + z2 / trials
    centre = (p + z2 / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z2 / (4 * trials * trials)) / denominator
    # The formula's ends are exactly 0 and 1 there; say so rather than leave rounding.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == trials else min(1.0, centre + half)
    return low, high
