"""The A/B gate's statistics and verdicts: the Hodges-Lehmann ratio and its exact
signed-rank interval, the Wilson interval, the threshold band, and A/A resampling."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.ab.decision import (
    AB_BLOCK_SIZE,
    AB_BUDGET_S,
    AB_CONFIDENCE,
    AB_MIN_PAIRS,
    AB_THRESHOLD,
    AbRule,
    AbVerdict,
    MetricDecision,
    all_decided,
    decide,
    decide_metric,
    effective_threshold,
    resampled_false_alarm_rate,
)
from harness.ab.stats import (
    EXACT_MAX_PAIRS,
    RatioInterval,
    _normal_lower_critical,
    min_pairs_for,
    paired_ratio_interval,
    signed_rank_lower_critical,
    wilson_interval,
)
from harness.errors import ConfigError, HarnessError
from harness.results import rules
from harness.results.run_record import METRICS, Direction

HIGHER = Direction.HIGHER_IS_BETTER
LOWER = Direction.LOWER_IS_BETTER
RULE = AbRule()


def _arms(log_ratios: list[float]) -> tuple[list[float], list[float]]:
    """Baselines of varying size, candidates exp(d) times them: the pairs' log ratios are d."""
    baseline = [100.0 + 17.0 * i for i in range(len(log_ratios))]
    return baseline, [b * math.exp(d) for b, d in zip(baseline, log_ratios, strict=True)]


def _interval(low: float, high: float, pairs: int = 12) -> RatioInterval:
    return RatioInterval(ratio=math.sqrt(low * high), low=low, high=high, confidence=0.95,
                         pairs=pairs)


# -- the signed-rank critical values ------------------------------------------------

#: Two-sided 5 % lower critical values of the Wilcoxon signed-rank T from published
#: tables (e.g. Siegel & Castellan; the ``n = 10: 8`` and ``n = 20: 52`` rows).
PUBLISHED_T_95 = {6: 0, 7: 2, 8: 3, 9: 5, 10: 8, 11: 10, 12: 13, 13: 17, 14: 21, 15: 25,
                  16: 29, 17: 34, 18: 40, 19: 46, 20: 52, 25: 89, 30: 137}


@pytest.mark.parametrize(("n", "critical"), sorted(PUBLISHED_T_95.items()))
def test_critical_values_match_published_table(n: int, critical: int) -> None:
    assert signed_rank_lower_critical(n, 0.95) == critical


@pytest.mark.parametrize("n", range(1, 13))
@pytest.mark.parametrize("confidence", [0.9, 0.95, 0.99])
def test_critical_values_match_brute_force(n: int, confidence: float) -> None:
    # Every subset of ranks {1..n} equally likely to be the positive ones: count them.
    sums = [sum(r for r in range(1, n + 1) if mask >> (r - 1) & 1) for mask in range(2 ** n)]
    tail = (1 - confidence) / 2
    fits = [t for t in range(n * (n + 1) // 2 + 1)
            if sum(s <= t for s in sums) / 2 ** n <= tail]
    assert signed_rank_lower_critical(n, confidence) == (max(fits) if fits else None)


def test_too_few_pairs_have_no_critical_value() -> None:
    assert signed_rank_lower_critical(5, 0.95) is None
    assert signed_rank_lower_critical(0, 0.95) is None
    assert min_pairs_for(0.95) == 6
    assert min_pairs_for(0.99) == 8
    assert min_pairs_for(0.90) == 5


def test_normal_approximation_beyond_the_exact_range() -> None:
    exact = signed_rank_lower_critical(EXACT_MAX_PAIRS)
    assert exact is not None
    # At the switch the continuity-corrected normal value is within a rank of the exact.
    normal = _normal_lower_critical(EXACT_MAX_PAIRS, 0.95)
    assert normal is not None
    assert abs(normal - exact) <= 1
    beyond = signed_rank_lower_critical(EXACT_MAX_PAIRS + 1)
    assert beyond == _normal_lower_critical(EXACT_MAX_PAIRS + 1, 0.95)
    assert beyond is not None
    assert beyond > exact


@pytest.mark.parametrize("confidence", [0.0, 1.0, -0.5, math.nan])
def test_confidence_out_of_range_raises(confidence: float) -> None:
    with pytest.raises(ValueError, match="confidence"):
        signed_rank_lower_critical(10, confidence)
    with pytest.raises(ValueError, match="confidence"):
        paired_ratio_interval([1.0] * 10, [1.0] * 10, confidence)


# -- the paired ratio interval ------------------------------------------------------

def test_six_pairs_at_95_span_the_extreme_walsh_averages() -> None:
    # n = 6: P(W+ <= 0) = 1/64 fits the 2.5 % tail and P(W+ <= 1) = 2/64 does not, so
    # T = 0 and the interval is [smallest, largest] Walsh average = [min d, max d].
    # Walsh averages of d = 1, 2, 3, 4, 5, 10 (21 of them, sorted):
    # 1 1.5 2 2 2.5 2.5 3 3 3 3.5 [3.5] 4 4 4.5 5 5.5 6 6.5 7 7.5 10: the median is 3.5.
    baseline, candidate = _arms([0.01, 0.02, 0.03, 0.04, 0.05, 0.10])
    found = paired_ratio_interval(baseline, candidate)
    assert found is not None
    assert found.pairs == 6
    assert found.confidence == 0.95
    assert found.ratio == pytest.approx(math.exp(0.035))
    assert found.low == pytest.approx(math.exp(0.01))
    assert found.high == pytest.approx(math.exp(0.10))


def test_ten_pairs_at_95_use_the_ninth_walsh_average_from_each_end() -> None:
    # n = 10: T = 8, so the interval is the 9th smallest to the 9th largest. For
    # d = 1..10 the Walsh averages begin 1 1.5 2 2 2.5 2.5 3 3 3 (9th: 3) and are
    # symmetric about 5.5, so the 9th largest is 8 and the median 5.5.
    baseline, candidate = _arms([0.01 * i for i in range(1, 11)])
    found = paired_ratio_interval(baseline, candidate)
    assert found is not None
    assert found.ratio == pytest.approx(math.exp(0.055))
    assert found.low == pytest.approx(math.exp(0.03))
    assert found.high == pytest.approx(math.exp(0.08))


def test_an_outlier_pair_barely_moves_the_estimate() -> None:
    # Five pairs unchanged and one where the candidate's start ran 10x slow: the mean
    # log ratio would say 32 % slower; Hodges-Lehmann stays at 1 (15 of 21 Walsh
    # averages are 0).
    baseline, candidate = _arms([0.0, 0.0, 0.0, 0.0, 0.0, math.log(0.1)])
    found = paired_ratio_interval(baseline, candidate)
    assert found is not None
    assert found.ratio == pytest.approx(1.0)
    assert found.high == pytest.approx(1.0)


def test_identical_arms_give_a_point_interval_at_one() -> None:
    found = paired_ratio_interval([50.0, 51.0, 49.0, 50.5, 50.2, 49.9],
                                  [50.0, 51.0, 49.0, 50.5, 50.2, 49.9])
    assert found == RatioInterval(1.0, 1.0, 1.0, 0.95, 6)


def test_coverage_by_simulation() -> None:
    # 2000 experiments of 12 pairs, each arm log-normal, the candidate truly 0.9x: the
    # exact interval's nominal coverage is 1 - 2 * P(W+ <= 13) = 95.75 % for n = 12.
    rng = random.Random(20240613)
    true_ratio, covered, experiments = 0.9, 0, 2000
    for _ in range(experiments):
        baseline = [50.0 * math.exp(rng.gauss(0, 0.05)) for _ in range(12)]
        candidate = [50.0 * true_ratio * math.exp(rng.gauss(0, 0.05)) for _ in range(12)]
        found = paired_ratio_interval(baseline, candidate)
        assert found is not None
        covered += found.low <= true_ratio <= found.high
    assert 0.93 <= covered / experiments <= 0.975


def test_below_the_minimum_pairs_there_is_no_interval() -> None:
    assert paired_ratio_interval([1.0] * 5, [2.0] * 5) is None
    assert paired_ratio_interval([], []) is None
    assert paired_ratio_interval([1.0] * 7, [2.0] * 7, confidence=0.99) is None
    assert paired_ratio_interval([1.0] * 8, [2.0] * 8, confidence=0.99) is not None


@pytest.mark.parametrize(("baseline", "candidate", "message"), [
    ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0], "baseline sample 1 is 0.0"),
    ([1.0, 1.0, 1.0], [1.0, 1.0, -2.0], "candidate sample 2 is -2.0"),
    ([1.0, 1.0, 1.0], [math.inf, 1.0, 1.0], "candidate sample 0 is inf"),
    ([1.0, math.nan, 1.0], [1.0, 1.0, 1.0], "baseline sample 1 is nan"),
    ([1.0, 1.0], [1.0, 1.0, 1.0], r"baseline values \(2\) as candidate values \(3\)"),
])
def test_invalid_samples_raise(baseline: list[float], candidate: list[float],
                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        paired_ratio_interval(baseline, candidate)


def test_many_pairs_use_the_normal_approximation_and_stay_fast() -> None:
    rng = random.Random(7)
    baseline = [100 * math.exp(rng.gauss(0, 0.02)) for _ in range(250)]
    candidate = [95 * math.exp(rng.gauss(0, 0.02)) for _ in range(250)]
    found = paired_ratio_interval(baseline, candidate)
    assert found is not None
    assert found.low < 0.95 < found.high
    assert found.high - found.low < 0.02


positive = st.floats(min_value=0.01, max_value=1e4, allow_nan=False, allow_infinity=False)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(positive, positive), min_size=6, max_size=40))
def test_interval_properties(pairs: list[tuple[float, float]]) -> None:
    baseline, candidate = [b for b, _ in pairs], [c for _, c in pairs]
    found = paired_ratio_interval(baseline, candidate)
    swapped = paired_ratio_interval(candidate, baseline)
    assert found is not None
    assert swapped is not None
    assert found.low <= found.ratio <= found.high
    assert found.pairs == len(pairs)
    # Swapping the arms negates every log ratio, so the interval inverts.
    assert swapped.ratio == pytest.approx(1 / found.ratio, rel=1e-12)
    assert swapped.low == pytest.approx(1 / found.high, rel=1e-12)
    assert swapped.high == pytest.approx(1 / found.low, rel=1e-12)


# -- the Wilson interval ------------------------------------------------------------

@pytest.mark.parametrize(("successes", "trials", "low", "high"), [
    (0, 60, 0.0, 0.0602),
    (5, 100, 0.0215, 0.1118),
    (50, 100, 0.4038, 0.5962),
    (10, 10, 0.7225, 1.0),
])
def test_wilson_known_values(successes: int, trials: int, low: float, high: float) -> None:
    found_low, found_high = wilson_interval(successes, trials)
    assert found_low == pytest.approx(low, abs=1e-4)
    assert found_high == pytest.approx(high, abs=1e-4)


def test_wilson_ends_are_exact_and_symmetric() -> None:
    assert wilson_interval(0, 60)[0] == 0.0
    assert wilson_interval(60, 60)[1] == 1.0
    low, high = wilson_interval(3, 40)
    mirror_low, mirror_high = wilson_interval(37, 40)
    assert low == pytest.approx(1 - mirror_high)
    assert high == pytest.approx(1 - mirror_low)
    assert wilson_interval(5, 100, 0.99)[1] > wilson_interval(5, 100)[1]


@pytest.mark.parametrize(("successes", "trials"), [(0, 0), (-1, 10), (11, 10)])
def test_wilson_refuses_impossible_counts(successes: int, trials: int) -> None:
    with pytest.raises(ValueError, match="trial"):
        wilson_interval(successes, trials)


# -- verdicts ----------------------------------------------------------------------

def test_verdict_words_are_the_history_rules() -> None:
    shared = ("REGRESSED", "IMPROVED", "UNCHANGED")
    assert [AbVerdict[n].value for n in shared] == [rules.FigureStatus[n].value for n in shared]
    assert AbVerdict.UNKNOWN.value == "unknown"


@pytest.mark.parametrize(("direction", "low", "high", "verdict"), [
    (HIGHER, 0.90, 0.95, AbVerdict.REGRESSED),
    (HIGHER, 1.04, 1.10, AbVerdict.IMPROVED),
    (HIGHER, 0.98, 1.02, AbVerdict.UNCHANGED),
    (HIGHER, 0.95, 1.00, AbVerdict.UNKNOWN),
    (HIGHER, 1.00, 1.05, AbVerdict.UNKNOWN),
    (HIGHER, 0.90, 1.10, AbVerdict.UNKNOWN),
    (LOWER, 1.04, 1.10, AbVerdict.REGRESSED),
    (LOWER, 0.90, 0.95, AbVerdict.IMPROVED),
    (LOWER, 0.98, 1.02, AbVerdict.UNCHANGED),
    (LOWER, 1.00, 1.05, AbVerdict.UNKNOWN),
    (LOWER, 0.95, 1.00, AbVerdict.UNKNOWN),
])
def test_decide_each_verdict_both_directions(direction: Direction, low: float, high: float,
                                             verdict: AbVerdict) -> None:
    assert decide(_interval(low, high), direction, RULE) is verdict


def test_no_interval_or_too_few_pairs_is_unknown() -> None:
    assert decide(None, HIGHER, RULE) == AbVerdict.UNKNOWN
    assert decide(_interval(0.5, 0.6, pairs=5), HIGHER, RULE) == AbVerdict.UNKNOWN
    assert decide(_interval(0.5, 0.6, pairs=8), HIGHER, AbRule(min_pairs=10)) == AbVerdict.UNKNOWN


def test_threshold_band_edges() -> None:
    slower, faster = 0.97, 1 / 0.97
    # Regressed needs the whole interval strictly beyond the edge; unchanged includes it.
    assert decide(_interval(0.96, slower), HIGHER, RULE) == AbVerdict.UNKNOWN
    assert decide(_interval(0.96, math.nextafter(slower, 0)), HIGHER, RULE) == AbVerdict.REGRESSED
    assert decide(_interval(slower, faster), HIGHER, RULE) == AbVerdict.UNCHANGED
    assert decide(_interval(slower, faster), LOWER, RULE) == AbVerdict.UNCHANGED
    assert decide(_interval(faster, 1.05), LOWER, RULE) == AbVerdict.UNKNOWN
    assert decide(_interval(math.nextafter(faster, 2), 1.05), LOWER, RULE) == AbVerdict.REGRESSED
    assert decide(_interval(faster, 1.05), HIGHER, RULE) == AbVerdict.UNKNOWN
    assert decide(_interval(math.nextafter(faster, 2), 1.05), HIGHER, RULE) == AbVerdict.IMPROVED


@pytest.mark.parametrize(("slowdown", "verdict"), [(0.035, AbVerdict.REGRESSED),
                                                   (0.025, AbVerdict.UNCHANGED)])
def test_a_slowdown_means_the_same_either_direction(slowdown: float,
                                                    verdict: AbVerdict) -> None:
    # Throughput times (1 - s), or time divided by (1 - s): the same work per second.
    speed = 1 - slowdown
    assert decide(_interval(speed, speed), HIGHER, RULE) == verdict
    assert decide(_interval(1 / speed, 1 / speed), LOWER, RULE) == verdict


def test_time_three_percent_longer_is_inside_the_band() -> None:
    # 1.03x the time is 2.9 % fewer completions per second: below a 3 % slowdown.
    assert decide(_interval(1.03, 1.03), LOWER, RULE) == AbVerdict.UNCHANGED


# -- the rule ----------------------------------------------------------------------

def test_rule_defaults_are_the_module_constants() -> None:
    assert AbRule() == AbRule(threshold=AB_THRESHOLD, confidence=AB_CONFIDENCE,
                          min_pairs=AB_MIN_PAIRS, budget_s=AB_BUDGET_S,
                          block_size=AB_BLOCK_SIZE)
    assert (RULE.threshold, RULE.confidence, RULE.min_pairs, RULE.budget_s,
            RULE.block_size) == (0.03, 0.95, 6, 180.0, 4)
    assert RULE.pairs_per_block == 2
    assert AbRule(block_size=8).pairs_per_block == 4
    assert AbRule(block_size=2).pairs_per_block == 1


@pytest.mark.parametrize(("changes", "message"), [
    ({"threshold": 0.0}, "threshold 0.0 must be between 0 and 1"),
    ({"threshold": 1.0}, "threshold 1.0 must be between 0 and 1"),
    ({"threshold": -0.1}, "threshold -0.1"),
    ({"threshold": math.nan}, "threshold nan"),
    ({"confidence": 0.4}, "confidence 0.4 must be at least 0.5 and below 1"),
    ({"confidence": 1.0}, "confidence 1.0"),
    ({"min_pairs": 5}, "min pairs 5 must be at least 6"),
    ({"confidence": 0.99, "min_pairs": 7}, "min pairs 7 must be at least 8"),
    ({"budget_s": 0.0}, "budget 0.0 s must be a finite number of seconds above 0"),
    ({"budget_s": math.inf}, "budget inf s"),
    ({"block_size": 0}, "block size 0 must be a positive multiple of 2"),
    ({"block_size": 3}, "block size 3"),
    ({"block_size": -4}, "block size -4"),
])
def test_rule_validation(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        AbRule(**changes)


# -- per metric --------------------------------------------------------------------

def _noisy(centre: float, n: int, seed: int, spread: float = 0.01) -> list[float]:
    rng = random.Random(seed)
    return [centre * math.exp(rng.gauss(0, spread)) for _ in range(n)]


def test_decide_metric_uses_the_metrics_direction() -> None:
    baseline = _noisy(100.0, 12, 1)
    slower_decode = decide_metric("decode_tps", baseline, [v * 0.9 for v in baseline], RULE)
    assert slower_decode.verdict == AbVerdict.REGRESSED
    assert slower_decode.metric == "decode_tps"
    assert slower_decode.pairs == 12
    assert slower_decode.interval is not None
    assert slower_decode.interval.ratio == pytest.approx(0.9)
    assert slower_decode.baseline_median is not None
    assert slower_decode.candidate_median == pytest.approx(0.9 * slower_decode.baseline_median)
    # The same 0.9 on a time is the candidate answering sooner.
    assert decide_metric("ttft_ms", baseline, [v * 0.9 for v in baseline],
                         RULE).verdict == AbVerdict.IMPROVED
    assert decide_metric("load_s", baseline, [v / 0.9 for v in baseline],
                         RULE).verdict == AbVerdict.REGRESSED
    same = decide_metric("prompt_tps", baseline, _noisy(100.0, 12, 2, spread=0.002), RULE)
    assert same.verdict == AbVerdict.UNCHANGED


def test_decide_metric_without_enough_pairs() -> None:
    few = decide_metric("decode_tps", [100.0] * 5, [50.0] * 5, RULE)
    assert few == MetricDecision("decode_tps", AbVerdict.UNKNOWN, None, 100.0, 50.0, 5)
    empty = decide_metric("decode_tps", [], [], RULE)
    assert empty == MetricDecision("decode_tps", AbVerdict.UNKNOWN, None, None, None, 0)


# -- absolute floors ------------------------------------------------------------------

def test_a_load_time_change_below_its_floor_is_not_a_regression() -> None:
    # bench loads in about 60 ms; 10 % slower is 6 ms, under load_s's 50 ms floor.
    baseline = _noisy(0.060, 12, 4)
    slower = decide_metric("load_s", baseline, [v * 1.10 for v in baseline], RULE)
    # Not a regression, and not "unchanged" either: the interval shows a change, which
    # only the floor keeps from counting.
    assert slower.verdict == AbVerdict.UNKNOWN
    assert slower.settled  # final: more pairs would only narrow it under the floor
    assert slower.reason is not None
    assert "smaller than load_s's floor of 0.05 s" in slower.reason
    assert "--fixture" in slower.reason
    share = METRICS["load_s"].min_change / slower.baseline_median  # type: ignore[operator]
    assert slower.threshold == pytest.approx(share / (1 + share))
    # Without the floor the same pairs are a regression: the floor made the difference.
    assert decide(slower.interval, LOWER, RULE) == AbVerdict.REGRESSED
    # Past the floor it counts: 0.06 s -> 0.15 s is 90 ms more.
    assert decide_metric("load_s", baseline, [v * 2.5 for v in baseline],
                         RULE).verdict == AbVerdict.REGRESSED


def test_a_floor_smaller_than_the_threshold_changes_nothing() -> None:
    # A 10 s load: load_s's 50 ms floor is 0.5 %, inside the 3 % band.
    baseline = _noisy(10.0, 12, 5)
    decision = decide_metric("load_s", baseline, [v * 1.10 for v in baseline], RULE)
    assert (decision.verdict, decision.threshold) == (AbVerdict.REGRESSED, RULE.threshold)
    # A metric without a floor keeps the rule's threshold however small its values.
    assert decide_metric("decode_tps", [0.001] * 6, [0.001] * 6, RULE).threshold == 0.03


def test_time_to_first_token_floor() -> None:
    # 17 ms: ttft_ms's 5 ms floor is a band of 5/22 = 22.7 %.
    baseline = _noisy(17.0, 12, 6)
    small = decide_metric("ttft_ms", baseline, [v * 1.15 for v in baseline], RULE)
    assert small.verdict == AbVerdict.UNKNOWN
    assert small.reason is not None
    assert "--ttft-prompt" in small.reason
    large = decide_metric("ttft_ms", baseline, [v * 1.5 for v in baseline], RULE)
    assert large.verdict == AbVerdict.REGRESSED
    assert small.threshold == pytest.approx(large.threshold)


def test_an_unchanged_only_the_floor_allows_is_unknown() -> None:
    """An interval that holds 1 (as an A/A comparison's does) but reaches past the
    rule's own band is "unchanged" only by the floor's widened band, where a change
    under the floor can hide: unknown, settled, with the reason. Inside the rule's own
    band it is unchanged."""
    baseline = _noisy(17.0, 12, 6)
    noisy_same = [v * f for v, f in zip(baseline, (0.94, 1.09, 1.0, 0.96, 1.10, 1.01,
                                                      0.97, 1.07, 0.99, 1.05, 0.93, 1.03),
                                        strict=True)]
    same = decide_metric("ttft_ms", baseline, noisy_same, RULE)
    assert same.interval is not None
    assert same.interval.low < 1 < same.interval.high
    assert same.interval.high > 1 / 0.97  # outside the rule's own band: the floor's doing
    # The widened band alone would call it unchanged.
    assert decide(same.interval, LOWER, RULE, same.threshold) == AbVerdict.UNCHANGED
    assert (same.verdict, same.settled) == (AbVerdict.UNKNOWN, True)
    assert same.reason is not None
    assert "reaches past the 3% band" in same.reason
    assert "ttft_ms's floor of 5 ms" in same.reason
    assert "--ttft-prompt 2048" in same.reason
    tiny = decide_metric("ttft_ms", baseline, [v * 1.01 for v in baseline], RULE)
    assert (tiny.verdict, tiny.reason, tiny.settled) == (AbVerdict.UNCHANGED, None, False)


@pytest.mark.parametrize(("direction", "min_change", "median", "expected"), [
    (LOWER, 0.0, 1.0, 0.03),
    (LOWER, 1.0, None, 0.03),
    (LOWER, 1.0, 0.0, 0.03),
    (LOWER, 1.0, 1.0, 0.5),
    (HIGHER, 0.5, 10.0, 0.05),
    (HIGHER, 0.1, 10.0, 0.03),
    # A throughput floor past the median itself: nothing below it could count.
    (HIGHER, 20.0, 10.0, 0.999),
])
def test_effective_threshold(direction: Direction, min_change: float,
                             median: float | None, expected: float) -> None:
    assert effective_threshold(RULE, direction, min_change, median) == pytest.approx(expected)


def test_resampling_applies_the_metrics_floor() -> None:
    # A/A pairs of a 60 ms load whose candidate start is 4 % slower every time: an
    # allocator's or a page cache's grain, 2.4 ms. Without the floor every look says
    # regressed; with load_s's, none does.
    rng = random.Random(8)
    pairs = []
    for _ in range(60):
        base = 0.060 * math.exp(rng.gauss(0, 0.005))
        pairs.append((base, base * 1.04))
    plain = resampled_false_alarm_rate(pairs, RULE, LOWER, trials=200,
                                       pairs_per_decision=12, seed=2, sequential=True)
    floored = resampled_false_alarm_rate(pairs, RULE, LOWER, trials=200,
                                         pairs_per_decision=12, seed=2, sequential=True,
                                         min_change=METRICS["load_s"].min_change)
    assert plain > 0.9
    assert floored == 0.0


def test_decide_metric_errors_name_the_metric() -> None:
    with pytest.raises(HarnessError, match="'tokens_per_joule' is not one the harness"):
        decide_metric("tokens_per_joule", [1.0] * 6, [1.0] * 6, RULE)
    with pytest.raises(HarnessError, match=r"decode_tps: candidate sample 2 is 0\.0"):
        decide_metric("decode_tps", [1.0] * 6, [1.0, 1.0, 0.0, 1.0, 1.0, 1.0], RULE)


def test_all_decided() -> None:
    def made(verdict: AbVerdict) -> MetricDecision:
        return MetricDecision("decode_tps", verdict, None, None, None, 0)

    assert all_decided([made(AbVerdict.REGRESSED), made(AbVerdict.UNCHANGED),
                        made(AbVerdict.IMPROVED)])
    assert not all_decided([made(AbVerdict.UNCHANGED), made(AbVerdict.UNKNOWN)])
    assert all_decided([])
    under_floor = MetricDecision("ttft_ms", AbVerdict.UNKNOWN, None, None, None, 6,
                                 reason="under the floor", settled=True)
    assert under_floor.final
    assert all_decided([made(AbVerdict.REGRESSED), under_floor])


# -- resampling recorded A/A pairs -------------------------------------------------

def _aa_pairs(n: int, seed: int, spread: float = 0.03) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    return [(100 * math.exp(rng.gauss(0, spread)), 100 * math.exp(rng.gauss(0, spread)))
            for _ in range(n)]


def test_resampled_rate_is_deterministic_with_a_seed() -> None:
    pairs = _aa_pairs(40, 3, spread=0.05)
    first = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                       pairs_per_decision=8, seed=11)
    again = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                       pairs_per_decision=8, seed=11)
    assert first == again
    assert 0.0 <= first <= 0.05


def test_resampled_rate_is_zero_for_identical_arms() -> None:
    pairs = [(v, v) for v in _noisy(100.0, 30, 4, spread=0.05)]
    for sequential in (False, True):
        assert resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=200,
                                          pairs_per_decision=12, seed=1,
                                          sequential=sequential) == 0.0


def test_resampled_rate_on_a_real_slowdown_is_the_detection_rate() -> None:
    slow = [(b, c * 0.9) for b, c in _aa_pairs(40, 5, spread=0.01)]
    for sequential in (False, True):
        assert resampled_false_alarm_rate(slow, RULE, HIGHER, trials=200,
                                          pairs_per_decision=12, seed=2,
                                          sequential=sequential) == 1.0
    # Lower-is-better: the candidate's 0.9x time is an improvement, never an alarm.
    assert resampled_false_alarm_rate(slow, RULE, LOWER, trials=200,
                                      pairs_per_decision=12, seed=2) == 0.0


def test_sequential_looks_count_alarms_one_look_misses() -> None:
    # Noisy A/A pairs: one look at 40 pairs never alarms, but looking after every block
    # up to 40 pairs, as the gate does, does now and then (0 vs 10 of 300 here).
    pairs = _aa_pairs(60, 6, spread=0.10)
    once = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                      pairs_per_decision=40, seed=3)
    looking = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                         pairs_per_decision=40, seed=3, sequential=True)
    assert once == 0.0
    assert 0.0 < looking <= 0.05


@pytest.mark.parametrize(("pairs", "trials", "per_decision", "message"), [
    ([], 10, 6, "at least one recorded pair"),
    ([(1.0, 1.0)], 0, 6, "trials 0"),
    ([(1.0, 1.0)], 10, 5, r"pairs per decision 5 must be at least the rule's min pairs \(6\)"),
])
def test_resampling_refuses_meaningless_settings(pairs: list[tuple[float, float]], trials: int,
                                                 per_decision: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=trials,
                                   pairs_per_decision=per_decision, seed=0)


def test_resampled_pairs_keep_their_covariate() -> None:
    # A/A pairs whose ratio is almost all the machine's speed between the two starts (a
    # 10 % spread a covariate reads). Each redrawn pair keeps its reading, so a draw that
    # happens to hold more slow-candidate pairs is adjusted for exactly that: one look at
    # 40 pairs never alarms, and looking block by block alarms no more than raw pairs do
    # (looks under MIN_ADJUSTED_PAIRS pairs are raw). Taking out only the spread, not a
    # draw's imbalance, the looks alarmed 13 % of the time: 8 pairs' mean machine ratio
    # is often past 3 %, and the narrowed interval no longer counted it.
    rng = random.Random(12)
    pairs, speeds = [], []
    for _ in range(60):
        moved = rng.gauss(0, 0.10)
        pairs.append((100.0, 100.0 * math.exp(moved + rng.gauss(0, 0.005))))
        speeds.append(moved)
    once = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                      pairs_per_decision=40, seed=3, covariates=[speeds])
    looking = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                         pairs_per_decision=40, seed=3, sequential=True,
                                         covariates=[speeds])
    raw = resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=300,
                                     pairs_per_decision=40, seed=3, sequential=True)
    assert once == 0.0
    assert looking <= raw <= 0.01
    with pytest.raises(ValueError, match="one value per recorded pair: 59 for 60"):
        resampled_false_alarm_rate(pairs, RULE, HIGHER, trials=1, pairs_per_decision=40,
                                   seed=3, covariates=[speeds[:-1]])
