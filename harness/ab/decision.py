"""The A/B verdict per metric: did the candidate build get worse, better, or neither?

Pure: samples in, verdicts out. The gate's runner collects paired samples block by
block and calls :func:`decide_metric` after each block until :func:`all_decided` or
the budget runs out; what is still ``unknown`` then stays unknown.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.ab.covariate import adjust
from harness.ab.stats import (
    RatioInterval,
    log_ratio_interval,
    min_pairs_for,
    paired_ratio_interval,
)
from harness.errors import ConfigError, HarnessError
from harness.results.rules import (
    AB_BLOCK_SIZE,
    AB_BUDGET_S,
    AB_CONFIDENCE,
    AB_EXTEND_S,
    AB_MIN_PAIRS,
    AB_THRESHOLD,
    AbVerdict,
)
from harness.results.run_record import METRICS, Direction, metric_direction

__all__ = [
    "AB_BLOCK_SIZE", "AB_BUDGET_S", "AB_CONFIDENCE", "AB_EXTEND_S", "AB_MIN_PAIRS",
    "AB_THRESHOLD", "AbRule", "AbVerdict", "MetricDecision", "all_decided", "decide",
    "decide_metric", "effective_threshold", "resampled_false_alarm_rate",
    "worth_extending",
]

# AbVerdict.UNKNOWN: not decided yet: the interval straddles an edge of the threshold
# band, or there are too few pairs. The defaults are harness/results/rules.py's, beside
# the history rule's.


@dataclass(frozen=True)
class AbRule:
    """When the paired A/B comparison calls a metric, and how long it may try.

    ``threshold``: the relative change that matters, as a slowdown: 0.03 is "3 %
    slower", a throughput ratio below 0.97 or a time ratio above 1/0.97 (see
    :func:`decide`). ``confidence``: of the ratio's interval. ``min_pairs``: no verdict
    from fewer pairs, at least what the confidence needs (6 at 95 %). ``budget_s``:
    wall time per metric before what is undecided stays ``unknown``. ``block_size``:
    server starts between two looks at the pairs: whole ABBA / BAAB quartets
    (interleaved, a multiple of 4) or whole pairs (duet, a multiple of 2).
    ``extend_s``: seconds past the budget measuring may go on while a metric is
    :func:`worth_extending` (0, the default here: never; ``harness ab``'s is
    ``AB_EXTEND_S``).

    A metric with an absolute floor (``Metric.min_change``, the history rule's too)
    also needs its change to pass the floor: the band widens to the floor where the
    floor is the larger change at the baseline's median (see :func:`effective_threshold`).
    """

    threshold: float = AB_THRESHOLD
    confidence: float = AB_CONFIDENCE
    min_pairs: int = AB_MIN_PAIRS
    budget_s: float = AB_BUDGET_S
    block_size: int = AB_BLOCK_SIZE
    extend_s: float = 0.0

    def __post_init__(self) -> None:
        # ``not 0 < x < 1`` also refuses NaN.
        if not 0 < self.threshold < 1:
            raise ConfigError(f"A/B threshold {self.threshold} must be between 0 and 1, "
                              "exclusive (a fraction: 0.03 is 3 %)")
        if not 0.5 <= self.confidence < 1:
            raise ConfigError(f"A/B confidence {self.confidence} must be at least 0.5 and "
                              "below 1 (0.95 is 95 %)")
        needed = min_pairs_for(self.confidence)
        if self.min_pairs < needed:
            raise ConfigError(f"A/B min pairs {self.min_pairs} must be at least {needed}: "
                              f"fewer pairs cannot reach {self.confidence:g} confidence")
        if not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise ConfigError(f"A/B budget {self.budget_s} s must be a finite number of "
                              "seconds above 0")
        if not (self.extend_s >= 0 and math.isfinite(self.extend_s)):
            raise ConfigError(f"A/B extension {self.extend_s} s must be a finite number of "
                              "seconds, 0 or more (0: stop at the budget)")
        if self.block_size < 2 or self.block_size % 2:
            raise ConfigError(f"A/B block size {self.block_size} must be a positive "
                              "multiple of 2 (whole pairs; interleaved: of 4, whole "
                              "ABBA or BAAB quartets)")

    @property
    def pairs_per_block(self) -> int:
        """Pairs one block adds: each pair is one start of each arm."""
        return self.block_size // 2


#: The widest band a floor can ask for: a change of 99.9 %; past it nothing could count.
_MAX_THRESHOLD = 0.999


def effective_threshold(rule: AbRule, direction: Direction, min_change: float,
                        baseline_median: float | None) -> float:
    """The rule's threshold, widened to a metric's absolute floor where that is larger.

    ``min_change`` is in the metric's unit. At the baseline's median ``m`` a move of
    ``min_change`` is the ratio 1 + f (f = min_change / m) for a time, 1 - f for a
    throughput; the threshold that makes that ratio the band's edge is f / (1 + f) or
    f. Measured here on ``bench``: load_s is about 60 ms and ttft_ms about 17 ms, so
    a 3 % band is 2 ms and 0.5 ms, the grain of a process start and of the client's
    clock, and each gave one false alarm in 32 A/A decisions without the floor.
    """
    if min_change <= 0 or baseline_median is None or baseline_median <= 0:
        return rule.threshold
    share = min_change / baseline_median
    floor = share / (1 + share) if direction is Direction.LOWER_IS_BETTER else share
    return min(max(rule.threshold, floor), _MAX_THRESHOLD)


def decide(interval: RatioInterval | None, direction: Direction, rule: AbRule,
           threshold: float | None = None) -> AbVerdict:
    """The verdict on a candidate/baseline ratio interval.

    The band of "no change that matters" is [1 - t, 1 / (1 - t)], t the threshold:
    symmetric in log space, so t = 3 % means "3 % slower" either way: a throughput
    ratio below 0.97, or a time ratio above 1/0.97 = 1.0309 (the same 3 % fewer
    completions per second). A plain [1 - t, 1 + t] would make a time 3 % worse a
    throughput 2.9 % worse.

    regressed: the whole interval is worse than the band (strictly); improved: the
    whole interval better than it; unchanged: the whole interval inside it (ends
    included); unknown otherwise, or without an interval, or below ``min_pairs``.
    ``threshold``: t, when not the rule's (:func:`effective_threshold`).
    """
    if interval is None or interval.pairs < rule.min_pairs:
        return AbVerdict.UNKNOWN
    low_edge = 1 - (rule.threshold if threshold is None else threshold)
    high_edge = 1 / low_edge
    if direction is Direction.HIGHER_IS_BETTER:
        worse, better = interval.high < low_edge, interval.low > high_edge
    else:
        worse, better = interval.low > high_edge, interval.high < low_edge
    if worse:
        return AbVerdict.REGRESSED
    if better:
        return AbVerdict.IMPROVED
    if low_edge <= interval.low and interval.high <= high_edge:
        return AbVerdict.UNCHANGED
    return AbVerdict.UNKNOWN


@dataclass(frozen=True)
class MetricDecision:
    """One metric's verdict and the numbers behind it (medians: None without samples)."""

    metric: str
    verdict: AbVerdict
    interval: RatioInterval | None
    baseline_median: float | None
    candidate_median: float | None
    pairs: int
    #: The band's t this verdict used: the rule's, or wider for a metric's floor.
    threshold: float = AB_THRESHOLD
    #: Why the verdict is unknown though the interval lies in the band (the design was
    #: not shown to see a change of this metric on this runner, or the change shown is
    #: under the metric's floor); None otherwise.
    reason: str | None = None
    #: An unknown that more pairs will not turn into a verdict (a change shown to lie
    #: under the metric's floor): final, like a verdict, so measuring it stops.
    settled: bool = False
    #: With a covariate: the variance of the adjusted log ratios over the raw ones'
    #: (below 1: it narrowed the interval); None without one.
    variance_share: float | None = None

    @property
    def final(self) -> bool:
        return self.verdict is not AbVerdict.UNKNOWN or self.settled


def decide_metric(metric: str, baseline: Sequence[float], candidate: Sequence[float],
                  rule: AbRule,
                  covariates: Sequence[Sequence[float]] | None = None) -> MetricDecision:
    """Judge ``metric`` from paired samples (baseline[i] and candidate[i] one pair).

    ``covariates``: columns of one value per pair that the build cannot move
    (harness/ab/covariate.py); the interval is then taken on the log ratios with their
    share taken out.

    Raises HarnessError for a metric METRICS lacks, or a sample that cannot enter a
    ratio (not finite, or not above 0), naming the metric and the sample.
    """
    direction = metric_direction(metric, "A/B")
    try:
        judged = _judge(baseline, candidate, direction, rule, METRICS[metric].min_change,
                        covariates=covariates)
    except ValueError as err:
        raise HarnessError(f"A/B metric {metric}: {err}") from err
    verdict, reason = judged.verdict, None
    if verdict is AbVerdict.UNCHANGED:
        reason = _under_the_floor(metric, judged, rule, direction)
        if reason is not None:
            verdict = AbVerdict.UNKNOWN
    return MetricDecision(
        metric=metric, verdict=verdict, interval=judged.interval,
        baseline_median=judged.baseline_median,
        candidate_median=statistics.median(candidate) if candidate else None,
        pairs=len(baseline), threshold=judged.threshold, reason=reason,
        settled=reason is not None, variance_share=judged.variance_share)


def worth_extending(decision: MetricDecision) -> bool:
    """Whether more measuring past the budget is worth its time for this metric: it is
    still ``unknown`` (not settled), and its interval lies wholly on one side of 1 (a
    change is shown) while it straddles an edge of the band (its size against the
    threshold is not). An interval that still holds 1 is left at the budget: it may be
    no change at all, and more of the same rarely settles it soon."""
    interval = decision.interval
    if decision.final or interval is None or decision.reason is not None:
        return False
    return interval.high < 1 or interval.low > 1


def all_decided(decisions: Iterable[MetricDecision]) -> bool:
    """Whether every metric has a verdict (or a settled unknown), so the gate can stop
    before its budget."""
    return all(d.final for d in decisions)


#: Where a metric under its floor gets large enough to judge.
FLOOR_HINTS = {"ttft_ms": "a longer first-token prompt: `harness ab --ttft-prompt 2048`",
               "load_s": "a model that loads for longer: `harness ab --fixture NAME`"}


def _under_the_floor(metric: str, judged: _Judged, rule: AbRule,
                     direction: Direction) -> str | None:
    """Why an "unchanged" is not one, when a metric's floor alone made it: the interval
    lies outside the rule's own band but inside the band the floor widened. Where the
    interval excludes 1 a change is shown that the floor is too coarse to count; where
    it holds 1 a change up to the floor's width could still hide in it (a first-token
    delay of 10 % at a 16 ms first token did, 2 times in 5). Either way no change the
    rule's band names was shown to be absent, so the verdict is unknown with this
    reason — settled, because more pairs would narrow the interval inside the floor's
    band, not the rule's, at no more than the floor's grain. None where the interval lies
    inside the rule's own band, which needs no floor."""
    interval, median = judged.interval, judged.baseline_median
    if interval is None or median is None or judged.threshold <= rule.threshold:
        return None
    if decide(interval, direction, rule) is AbVerdict.UNCHANGED:
        return None
    defined = METRICS[metric]
    floor = (f"{metric}'s floor of {defined.min_change:g} {defined.unit} "
             f"({judged.threshold:.0%} at the baseline's {median:.4g} {defined.unit})")
    shown = (f"the candidate/baseline ratio {interval.ratio:.3f} ({interval.low:.3f}-"
             f"{interval.high:.3f})")
    if interval.low <= 1 <= interval.high:
        finding = (f"{shown} reaches past the {rule.threshold:.0%} band; only {floor} "
                   "would call it unchanged, and a change under the floor can hide there")
    else:
        finding = f"{shown} is a real change, but smaller than {floor}"
    return (f"{finding}, so the rule does not judge it; measure where the metric is "
            f"larger ({FLOOR_HINTS.get(metric, 'a larger fixture')})")


@dataclass(frozen=True)
class _Judged:
    interval: RatioInterval | None
    baseline_median: float | None
    threshold: float
    verdict: AbVerdict
    variance_share: float | None = None


def _judge(baseline: Sequence[float], candidate: Sequence[float], direction: Direction,
           rule: AbRule, min_change: float, *,
           covariates: Sequence[Sequence[float]] | None = None) -> _Judged:
    """The one path from pairs to a verdict, for the gate and for the resampled rate."""
    interval = paired_ratio_interval(baseline, candidate, rule.confidence)
    share = None
    if covariates and interval is not None:
        # paired_ratio_interval has checked every sample is finite and above 0.
        adjusted = adjust([math.log(c) - math.log(b)
                           for b, c in zip(baseline, candidate, strict=True)], covariates)
        interval, share = log_ratio_interval(adjusted.log_ratios, rule.confidence), \
            adjusted.variance_share
    median = statistics.median(baseline) if baseline else None
    threshold = effective_threshold(rule, direction, min_change, median)
    return _Judged(interval, median, threshold, decide(interval, direction, rule, threshold),
                   share)


def _verdict(sample: Sequence[tuple[float, float]], direction: Direction,
             rule: AbRule, min_change: float,
             covariates: Sequence[Sequence[float]] | None = None) -> AbVerdict:
    return _judge([b for b, _ in sample], [c for _, c in sample], direction, rule,
                  min_change, covariates=covariates).verdict


def _sequential_verdict(sample: Sequence[tuple[float, float]], direction: Direction,
                        rule: AbRule, min_change: float,
                        covariates: Sequence[Sequence[float]] | None = None) -> AbVerdict:
    # Look as the gate does: after each block, from min_pairs on, stopping at the first
    # verdict. Every look is a chance of a false alarm, which one fixed-size look misses.
    step = rule.pairs_per_block
    for n in range(step, len(sample) + 1, step):
        if n < rule.min_pairs:
            continue
        looked = [column[:n] for column in covariates] if covariates else None
        verdict = _verdict(sample[:n], direction, rule, min_change, looked)
        if verdict is not AbVerdict.UNKNOWN:
            return verdict
    return AbVerdict.UNKNOWN


def resampled_false_alarm_rate(pairs: Sequence[tuple[float, float]], rule: AbRule,
                               direction: Direction, *, trials: int,
                               pairs_per_decision: int, seed: int,
                               sequential: bool = False, min_change: float = 0.0,
                               covariates: Sequence[Sequence[float]] | None = None) -> float:
    """The share of decisions that say regressed, on pairs redrawn from an A/A run.

    ``pairs``: recorded (baseline, candidate) samples of one metric where both arms
    were the same build, so every "regressed" is a false alarm. Each trial draws
    ``pairs_per_decision`` of them with replacement (``random.Random(seed)``: the same
    seed gives the same rate) and applies the gate's interval and :func:`decide`.
    ``sequential``: judge each trial as the gate runs, after every block until the
    first verdict (looks at whole blocks only: pairs past the last whole block are
    drawn but not judged), rather than once on all its pairs. ``min_change``: the
    metric's absolute floor, as the gate applies it (:func:`effective_threshold`).
    ``covariates``: columns of one value per recorded pair (harness/ab/covariate.py);
    each redrawn pair keeps its own values, and every look is adjusted by them as the
    gate adjusts its pairs.
    """
    if not pairs:
        raise ValueError("resampling needs at least one recorded pair")
    if trials < 1:
        raise ValueError(f"trials {trials} must be at least 1")
    if pairs_per_decision < rule.min_pairs:
        # Every decision would be unknown, and the rate a meaningless 0.
        raise ValueError(f"pairs per decision {pairs_per_decision} must be at least the "
                         f"rule's min pairs ({rule.min_pairs})")
    for column in covariates or ():
        if len(column) != len(pairs):
            raise ValueError(f"a covariate needs one value per recorded pair: "
                             f"{len(column)} for {len(pairs)} pairs")
    rng = random.Random(seed)
    judge = _sequential_verdict if sequential else _verdict
    alarms = 0
    for _ in range(trials):
        # Indices, so a pair's covariate values travel with it.
        drawn = rng.choices(range(len(pairs)), k=pairs_per_decision)
        columns = ([[column[i] for i in drawn] for column in covariates]
                   if covariates else None)
        alarms += judge([pairs[i] for i in drawn], direction, rule, min_change,
                        columns) == AbVerdict.REGRESSED
    return alarms / trials
