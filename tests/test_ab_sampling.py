"""More signal per A/B pair: warm-up and decode length sized by measurement, and the
slot covariate (harness/ab/sampling.py, harness/ab/covariate.py; pure)."""

from __future__ import annotations

import math
import os
import random
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from harness.ab.covariate import (
    BOTH_COVARIATES,
    MACHINE_COVARIATE,
    MIN_ADJUSTED_PAIRS,
    SLOT_COVARIATE,
    adjust,
    covariates_for,
    machine_covariate,
    slot_covariate,
)
from harness.ab.decision import AbRule, decide_metric
from harness.ab.design import BASELINE, CANDIDATE, SEQUENTIAL, Sample
from harness.ab.machine_speed import machine_speed
from harness.ab.report import outcome_json, table
from harness.ab.runner import PROBE, AbSettings, Arm, Measured, run_ab
from harness.ab.sampling import (
    LONGEST_GEN,
    MEDIAN_EFFICIENCY,
    PROBE_REPETITIONS,
    WITHIN_SHARE,
    gen_tokens_for,
    plan_sampling,
    t_quantile,
    warmup_length,
)
from harness.ab.stats import paired_ratio_interval
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_REPETITIONS
from harness.perf.measure import measure_speeds


def test_a_series_without_warm_up_keeps_every_value() -> None:
    rng = random.Random(1)
    for _ in range(50):
        assert warmup_length([100 + rng.gauss(0, 1) for _ in range(12)]) == 0


def test_slow_leading_values_are_cut_as_warm_up() -> None:
    rng = random.Random(2)
    series = [60.0, 75.0, 88.0] + [100 + rng.gauss(0, 1) for _ in range(9)]
    assert warmup_length(series) == 3


def test_warm_up_never_takes_more_than_half_the_series() -> None:
    # A series that only ever climbs: MSER would cut to the last two values unbounded.
    assert warmup_length([float(v) for v in range(12)]) <= 6


@pytest.mark.parametrize(("dof", "table"), [(6, 5.208), (10, 4.144), (30, 3.385)])
def test_the_t_quantile_is_within_a_percent_of_the_table(dof: int, table: float) -> None:
    assert t_quantile(0.999, dof) == pytest.approx(table, rel=0.01)


def test_too_short_a_series_has_no_warm_up() -> None:
    assert warmup_length([1.0, 50.0, 50.0]) == 0


def test_a_quiet_decode_keeps_its_length() -> None:
    assert gen_tokens_for(0.001, tokens=64, repetitions=5, threshold=0.03) == 64


def test_a_noisy_decode_doubles_until_its_noise_is_small_beside_the_threshold() -> None:
    spread, reps, threshold = 0.03, 5, 0.03
    chosen = gen_tokens_for(spread, tokens=64, repetitions=reps, threshold=threshold)
    target = WITHIN_SHARE * -math.log(1 - threshold)

    def error(tokens: int) -> float:
        return MEDIAN_EFFICIENCY * spread * math.sqrt(64 / tokens) / math.sqrt(reps)

    assert chosen == 512
    assert error(chosen) <= target < error(chosen // 2)


def test_decode_length_is_capped() -> None:
    assert gen_tokens_for(1.0, tokens=64, repetitions=5, threshold=0.03) == LONGEST_GEN


@pytest.mark.parametrize("spread", [None, 0.0, math.nan])
def test_no_spread_keeps_the_length(spread: float | None) -> None:
    assert gen_tokens_for(spread, tokens=64, repetitions=5, threshold=0.03) == 64


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="repetitions 0"):
        gen_tokens_for(0.1, tokens=64, repetitions=0, threshold=0.03)


def test_the_plan_cuts_the_warm_up_before_taking_the_spread() -> None:
    rng = random.Random(3)
    speeds = [500.0, 800.0] + [1000 * math.exp(rng.gauss(0, 0.002)) for _ in range(10)]
    plan = plan_sampling(speeds, tokens=64, repetitions=5, threshold=0.03)
    assert plan.warmup == 2
    assert plan.spread is not None
    assert plan.spread < 0.01
    assert plan.gen_tokens == 64  # quiet once warm: the default length is enough
    fixed = plan_sampling(speeds, tokens=64, repetitions=5, threshold=0.03,
                          size_tokens=False, size_warmup=False)
    assert (fixed.warmup, fixed.gen_tokens) == (0, 64)
    assert "64 decode tokens" in plan.describe()


def _sample(arm: str, pair: int, sequence: int, value: float,
            half: int | None = 0) -> Sample:
    return Sample(arm=arm, pair=pair, block=0, sequence=sequence, at_s=0.0,
                  values={"decode_tps": value}, counters={}, half=half)


def test_the_slot_is_which_arm_ran_first_or_had_the_first_half() -> None:
    sequential = [_sample(CANDIDATE, 0, 0, 1.0), _sample(BASELINE, 0, 1, 1.0),
                  _sample(BASELINE, 1, 2, 1.0), _sample(CANDIDATE, 1, 3, 1.0)]
    assert slot_covariate(sequential, "decode_tps") == [1.0, -1.0]
    duet = [_sample(BASELINE, 0, 0, 1.0, half=1), _sample(CANDIDATE, 0, 1, 1.0, half=0),
            _sample(BASELINE, 1, 2, 1.0, half=0), _sample(CANDIDATE, 1, 3, 1.0, half=1)]
    assert slot_covariate(duet, "decode_tps") == [1.0, -1.0]
    # A pair missing an arm is left out, as paired_values leaves it out.
    assert slot_covariate([*sequential, _sample(BASELINE, 2, 4, 1.0)], "decode_tps") \
        == [1.0, -1.0]


def test_the_covariate_takes_out_an_order_effect_and_keeps_the_change() -> None:
    rng = random.Random(7)
    slots = [rng.choice((1.0, -1.0)) for _ in range(40)]
    # A real 5 % slowdown, plus 4 % for whichever start ran second, plus small noise.
    logs = [math.log(0.95) - 0.04 * s + rng.gauss(0, 0.005) for s in slots]
    done = adjust(logs, [slots])
    assert done.variance_share < 0.1
    assert done.theta == pytest.approx(-0.04, abs=0.01)
    # The coins' imbalance is taken out with the spread: what is left is the change.
    assert statistics.fmean(slots) != 0
    assert statistics.fmean(done.log_ratios) == pytest.approx(
        statistics.fmean(logs) - done.theta * statistics.fmean(slots))
    assert math.exp(statistics.median(done.log_ratios)) == pytest.approx(0.95, abs=0.002)


def test_few_pairs_or_a_flat_covariate_are_left_as_they_are() -> None:
    logs = [0.01 * i for i in range(MIN_ADJUSTED_PAIRS - 1)]
    alternating = [(-1.0) ** i for i in range(len(logs))]
    assert adjust(logs, [alternating]).log_ratios == tuple(logs)
    many = [0.01 * i for i in range(20)]
    assert adjust(many, [[1.0] * 20]).variance_share == 1.0
    with pytest.raises(ValueError, match="one value per pair"):
        adjust(many, [[1.0]])


def test_an_adjusted_decision_narrows_the_interval_and_says_by_how_much() -> None:
    rng = random.Random(5)
    slots = [rng.choice((1.0, -1.0)) for _ in range(30)]
    baseline = [100.0 * math.exp(rng.gauss(0, 0.003)) for _ in slots]
    candidate = [b * 0.95 * math.exp(-0.05 * s) for b, s in zip(baseline, slots, strict=True)]
    rule = AbRule()
    raw = decide_metric("decode_tps", baseline, candidate, rule)
    adjusted = decide_metric("decode_tps", baseline, candidate, rule, covariates=[slots])
    assert raw.variance_share is None
    assert adjusted.variance_share is not None
    assert adjusted.variance_share < 0.2
    assert raw.interval is not None
    assert adjusted.interval is not None
    assert adjusted.interval.high - adjusted.interval.low \
        < (raw.interval.high - raw.interval.low) / 3
    assert adjusted.verdict == "regressed"
    unadjusted = paired_ratio_interval(baseline, candidate)
    assert unadjusted == raw.interval


def test_the_probe_sizes_every_start_and_the_client_leaves_the_servers_cores(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runner's control flow with scripted measurements (no server starts): one
    probe start times PROBE_REPETITIONS completions at 64 tokens, its slow first two
    are warm-up and its spread asks for longer completions; every compared start then
    runs with those sizes, its client on the half of the cores its server is not on."""
    rng = random.Random(6)
    seen: list[tuple[str, int | None, int | None, int, set[int] | None, set[int] | None]] = []

    def measure(self: Any, cpus: set[int] | None,
                client: set[int] | None = None) -> Measured:
        settings = self._settings
        seen.append((self._arm.label, settings.n_gen, settings.warmup, settings.repetitions,
                     cpus, client))
        each = [50.0, 70.0] + [100 * math.exp(rng.gauss(0, 0.03))
                               for _ in range(settings.repetitions - 2)]
        return Measured({"decode_tps": statistics.median(each)}, {}, None, tuple(each))

    monkeypatch.setattr("harness.ab.runner._Starter.measure", measure)
    monkeypatch.setattr("harness.ab.runner.core_halves", lambda: ({0}, {1}))
    monkeypatch.setattr("harness.ab.runner.usable_cores", lambda: [0, 1])
    arms = (Arm("baseline", binary=Path("/bin/true")), Arm("candidate", binary=Path("/bin/true")))
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", design=SEQUENTIAL,
                          metrics=("decode_tps",), rule=AbRule(budget_s=1e-6), seed=1,
                          n_gen=None, warmup=None, pin_client=True, covariate=SLOT_COVARIATE)
    outcome = run_ab(*arms, settings, log_dir=tmp_path / "logs")
    probe, *compared = seen
    assert probe[:4] == (PROBE, DEFAULT_GEN_TOKENS, 0, PROBE_REPETITIONS)
    assert probe[4:] == ({0}, {1})
    assert outcome.settings.warmup == 2
    assert outcome.settings.n_gen is not None
    assert outcome.settings.n_gen > DEFAULT_GEN_TOKENS
    assert compared
    assert all(
        (n_gen, warmup, reps) == (outcome.settings.n_gen, 2, DEFAULT_REPETITIONS)
        for _, n_gen, warmup, reps, _, _ in compared)
    assert all(cpus is not None and client == {0, 1} - cpus
               for _, _, _, _, cpus, client in compared)
    body = outcome_json(outcome)
    assert (body["n_gen"], body["warmup"], body["pin_client"], body["covariate"]) == \
        (outcome.settings.n_gen, 2, True, SLOT_COVARIATE)
    assert f"decode {outcome.settings.n_gen} tokens x 5 completions after 2 warm-up" \
        in table(outcome)


def test_two_covariates_are_fitted_together() -> None:
    """The machine's speed explains a drift the slot does not: fitted together, both come
    out, each with its own coefficient, and the real change stays."""
    rng = random.Random(7)
    slots = [rng.choice((1.0, -1.0)) for _ in range(40)]
    machine = [rng.gauss(0, 0.05) for _ in slots]
    logs = [math.log(0.95) + 0.03 * s + 0.8 * m + rng.gauss(0, 0.002)
            for s, m in zip(slots, machine, strict=True)]
    both = adjust(logs, [slots, machine])
    assert both.variance_share < 0.05
    assert both.theta == pytest.approx(0.03, abs=0.005)
    assert adjust(logs, [slots]).variance_share > 0.3  # the slot alone leaves the drift
    assert math.exp(statistics.median(both.log_ratios)) == pytest.approx(0.95, abs=0.005)
    # A column that repeats another adds nothing and breaks nothing.
    assert adjust(logs, [machine, machine]).variance_share == pytest.approx(
        adjust(logs, [machine]).variance_share)


def test_the_machine_speed_is_read_on_the_cores_asked_and_leaves_the_thread_as_it_was(
) -> None:
    before = os.sched_getaffinity(0)
    speed = machine_speed({min(before)})
    assert speed > 1e5  # iterations a second: a 200k-iteration loop takes well under 2 s
    assert os.sched_getaffinity(0) == before


def test_the_machine_covariate_pairs_the_readings_and_needs_every_one() -> None:
    samples = [_sample(CANDIDATE, 0, 0, 1.0), _sample(BASELINE, 0, 1, 1.0)]
    samples = [replace(samples[0], machine=110.0), replace(samples[1], machine=100.0)]
    assert machine_covariate(samples, "decode_tps") == pytest.approx([math.log(1.1)])
    both = covariates_for(BOTH_COVARIATES, samples, "decode_tps")
    assert both is not None
    assert both[0] == [1.0]
    assert both[1] == pytest.approx([math.log(1.1)])
    unread = [replace(samples[0], machine=None), samples[1]]
    assert machine_covariate(unread, "decode_tps") is None
    assert covariates_for(MACHINE_COVARIATE, unread, "decode_tps") is None
    assert covariates_for("none", samples, "decode_tps") is None


def test_alternating_servers_take_their_requests_in_turns_abba(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """harness.perf.measure.measure_speeds sends each request to every server in turn, the
    order reversed each round, so neither server is always second (scripted client: the
    order is the thing under test, not a server)."""
    asked: list[str] = []

    class Done:
        tokens_predicted = 8

        def __init__(self, url: str) -> None:
            speed = 100.0 if url.endswith("a") else 90.0
            self.raw = {"timings": {"prompt_per_second": speed, "predicted_per_second": speed}}

    class Client:
        def __init__(self, url: str, **_: Any) -> None:
            self.url = url

        def __enter__(self) -> Client:
            return self

        def __exit__(self, *_: object) -> None:
            return None

        def completion(self, *_: Any, **__: Any) -> Done:
            asked.append(self.url)
            return Done(self.url)

    def first_token(_http: object, url: str, _prompt: object, _timeout: float) -> float:
        asked.append(f"first {url}")
        return 10.0

    monkeypatch.setattr("harness.perf.measure.ServerClient", Client)
    monkeypatch.setattr("harness.perf.measure._time_to_first_token", first_token)
    a, b = measure_speeds(["http://a", "http://b"], 4, 8, 3, warmup=1)
    assert asked == ["first http://a", "first http://b", "first http://b", "first http://a",
                     "first http://a", "first http://b",
                     "http://a", "http://b", "http://b", "http://a", "http://a", "http://b",
                     "http://b", "http://a"]
    assert (a.decode_tps, b.decode_tps) == (100.0, 90.0)
    assert len(a.decode_each) == len(b.decode_each) == 3  # the warm-up round not counted
