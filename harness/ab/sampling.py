"""How much each A/B start measures: warm-up and decode length sized by measurement (pure).

A pair's log ratio carries two kinds of noise: what differs between two server starts
(where the model landed in memory, the moment of the machine) and what differs between
the timed completions of one start (a scheduling hiccup inside a 30 ms decode). The
second shrinks with the tokens each completion decodes, at the cost of the seconds they
take; the first does not. So the decode is made just long enough that its own noise is
small beside the threshold, and no longer: past that the time buys more pairs instead.

Both sizes come from one probe start of the baseline that runs more completions than a
compared start does (:data:`PROBE_REPETITIONS`) at the default length:

- **Warm-up by measurement** (:func:`warmup_length`): the leading completions that the
  marginal standard error rule (MSER, White 1997) cuts from the probe's series — the
  truncation point that minimises the standard error of the mean of what is left —
  trimmed back to the last one too slow to be one more value of the rest (below the
  rest's one-sided :data:`WARM_CONFIDENCE` prediction bound, Student's t on the rest's
  own spread): a warming server is slower, and MSER alone cuts a value or two from a
  series with no warm-up at all, whichever way its noise happens to lead. Every
  compared start then runs that many completions first and does not count them.
- **Tokens sized to the noise** (:func:`gen_tokens_for`): the spread of the probe's
  counted completions (log decode speed) predicts the spread of a longer one as
  1/sqrt(tokens), the slower of the two ways timing noise shrinks (a fixed jitter per
  completion shrinks as 1/tokens), so the prediction errs long. The decode doubles from
  the default until the start's figure (the median of its completions) is predicted to
  vary by at most :data:`WITHIN_SHARE` of the threshold, up to :data:`LONGEST_GEN`.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

#: Completions the probe start times: enough for MSER to see a warm-up of a few and to
#: leave a spread from the rest.
PROBE_REPETITIONS = 12
#: MSER truncates at most this share of the series (its usual bound: past half, the
#: rule's own noise picks the point).
MSER_MAX_SHARE = 0.5
#: A leading value is warm-up only below the rest's prediction bound at this level.
WARM_CONFIDENCE = 0.999
#: The standard error of a start's decode figure the sizing aims under, as a share of the
#: threshold: a quarter keeps a start's own noise small beside a 3 % change while the
#: noise between starts, which tokens cannot shrink, is left to the pairs.
WITHIN_SHARE = 0.25
#: The standard error of a median over its mean's, for normal samples (sqrt(pi/2)).
MEDIAN_EFFICIENCY = math.sqrt(math.pi / 2)
#: The longest decode one timed completion gets (the context grows to hold it).
LONGEST_GEN = 1024


@dataclass(frozen=True)
class SamplingPlan:
    """What each compared start measures, and the probe figures it was sized from."""

    gen_tokens: int
    #: Completions each start runs first and does not count.
    warmup: int
    #: The probe's per-completion spread of log decode speed after its warm-up, robust
    #: (:func:`robust_spread`; None: too few completions to tell).
    spread: float | None = None

    def describe(self) -> str:
        spread = "" if self.spread is None else f", probe spread {self.spread:.1%}"
        return (f"{self.gen_tokens} decode tokens per completion, {self.warmup} warm-up "
                f"completion(s) discarded{spread}")


def warmup_length(values: Sequence[float]) -> int:
    """How many leading values of a series are warm-up, by the marginal standard error
    rule: the ``d`` (at most half the series, leaving at least two) minimising
    ``sum((x_i - mean)^2) / (n - d)^2`` over the values from ``d`` on, trimmed while the
    last value it cuts lies above the one-sided ``WARM_CONFIDENCE`` prediction bound of
    what is left (``values``: speeds, or their logs; higher is warmer). 0 for a series
    too short to judge or without a warm-up."""
    n = len(values)
    if n < 4:
        return 0
    best, best_score = 0, math.inf
    for d in range(math.floor(n * MSER_MAX_SHARE) + 1):
        rest = values[d:]
        if len(rest) < 2:
            break
        mean = statistics.fmean(rest)
        score = sum((x - mean) ** 2 for x in rest) / len(rest) ** 2
        # Strictly smaller: an equal score keeps the shorter cut (nothing shown warm).
        if score < best_score:
            best, best_score = d, score
    while best > 0:
        rest = values[best:]
        mean, spread = statistics.fmean(rest), statistics.stdev(rest)
        bound = t_quantile(WARM_CONFIDENCE, len(rest) - 1) * spread * math.sqrt(
            1 + 1 / len(rest))
        if mean - values[best - 1] > bound:
            break
        best -= 1
    return best


def t_quantile(p: float, dof: int) -> float:
    """Student's t quantile by the Cornish-Fisher expansion in 1/dof (within 1 % of the
    table from 6 degrees of freedom at 0.999; the stdlib has only the normal's)."""
    z = statistics.NormalDist().inv_cdf(p)
    v = float(dof)
    return (z + (z ** 3 + z) / (4 * v) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * v ** 2)
            + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * v ** 3))


def gen_tokens_for(spread: float | None, *, tokens: int, repetitions: int,
                   threshold: float) -> int:
    """Decode tokens per completion: ``tokens`` (what ``spread`` was measured at) doubled
    until a start's figure, the median of ``repetitions`` completions, is predicted to
    vary by at most ``WITHIN_SHARE`` of ``threshold``; at most ``LONGEST_GEN``.
    ``spread``: the standard deviation of log decode speed between completions."""
    if tokens < 1 or repetitions < 1 or not 0 < threshold < 1:
        raise ValueError(f"tokens {tokens} and repetitions {repetitions} must be at least "
                         f"1, and threshold {threshold} a fraction between 0 and 1")
    if spread is None or not math.isfinite(spread) or spread <= 0:
        return tokens
    target = WITHIN_SHARE * abs(math.log(1 - threshold))
    chosen = tokens
    while chosen < LONGEST_GEN:
        error = MEDIAN_EFFICIENCY * spread * math.sqrt(tokens / chosen) / math.sqrt(repetitions)
        if error <= target:
            break
        chosen *= 2
    return min(chosen, max(tokens, LONGEST_GEN))


def robust_spread(values: Sequence[float]) -> float:
    """The standard deviation a normal sample with this median absolute deviation has
    (1.4826 MAD): a start's figure is a median, so one hiccup among the probe's
    completions (seen here: 9 % standard deviation at 64 tokens from a few, 3.9 % MAD)
    should not size every start."""
    centre = statistics.median(values)
    return 1.4826 * statistics.median(abs(v - centre) for v in values)


def plan_sampling(probe_speeds: Sequence[float], *, tokens: int, repetitions: int,
                  threshold: float, size_tokens: bool = True,
                  size_warmup: bool = True) -> SamplingPlan:
    """The sampling plan from the probe's per-completion decode speeds (tokens/s, in the
    order run) at ``tokens`` per completion. ``size_tokens``/``size_warmup`` False keeps
    ``tokens`` / no warm-up (what the caller fixed)."""
    logs = [math.log(v) for v in probe_speeds if math.isfinite(v) and v > 0]
    warmup = warmup_length(logs) if size_warmup else 0
    counted = logs[warmup:]
    spread = robust_spread(counted) if len(counted) >= 3 else None
    gen = (gen_tokens_for(spread, tokens=tokens, repetitions=repetitions,
                          threshold=threshold) if size_tokens else tokens)
    return SamplingPlan(gen_tokens=gen, warmup=warmup, spread=spread)
