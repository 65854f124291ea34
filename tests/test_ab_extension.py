"""The A/B budget that follows the evidence: past the budget only while a shown change is
still being sized against the threshold, and only up to the extension's ceiling.

The rule is pure (``worth_extending``); the runner's loop is driven with scripted
measurements (no server starts: the control flow of the extension, not a speed).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

import pytest

from harness.ab.decision import AbRule, AbVerdict, MetricDecision, worth_extending
from harness.ab.design import BASELINE, INTERLEAVED
from harness.ab.report import outcome_json, table
from harness.ab.runner import AbOutcome, AbSettings, Arm, Measured, run_ab
from harness.ab.stats import RatioInterval
from harness.errors import ConfigError


def _decision(low: float, high: float, *, verdict: AbVerdict = AbVerdict.UNKNOWN,
              reason: str | None = None, settled: bool = False) -> MetricDecision:
    interval = RatioInterval(ratio=(low * high) ** 0.5, low=low, high=high, pairs=12,
                             confidence=0.95)
    return MetricDecision("decode_tps", verdict, interval, 100.0, 96.0, 12, reason=reason,
                          settled=settled)


@pytest.mark.parametrize(("low", "high", "worth"), [
    (0.94, 0.98, True),    # slower for sure; 3 % slower or not, not yet
    (1.02, 1.04, True),    # faster for sure, the upper edge 1.031 straddled
    (0.95, 1.01, False),   # may be no change at all: the budget's call stands
    (0.99, 1.02, False),
])
def test_only_a_shown_change_that_straddles_the_threshold_is_worth_more_time(
        low: float, high: float, worth: bool) -> None:
    assert worth_extending(_decision(low, high)) is worth


def test_a_decided_or_settled_metric_or_an_unearned_unchanged_asks_for_nothing() -> None:
    assert not worth_extending(_decision(0.90, 0.95, verdict=AbVerdict.REGRESSED))
    assert not worth_extending(_decision(0.94, 0.98, settled=True, reason="under the floor"))
    assert not worth_extending(_decision(0.98, 0.99, reason="design not validated"))
    no_interval = MetricDecision("decode_tps", AbVerdict.UNKNOWN, None, None, None, 2)
    assert not worth_extending(no_interval)


def test_the_extension_is_seconds_zero_or_more() -> None:
    assert AbRule().extend_s == 0.0  # bisect and tune keep their own budgets
    with pytest.raises(ConfigError, match="extension"):
        AbRule(extend_s=-1.0)
    with pytest.raises(ConfigError, match="extension"):
        AbRule(extend_s=math.inf)


def _scripted(monkeypatch: pytest.MonkeyPatch, candidate_ratio: float, seed: int) -> None:
    """Each start measures decode 100 t/s (baseline) or ``candidate_ratio`` of it, with
    1.4 % of log-normal noise a start (2 % on a pair's ratio)."""
    noise = random.Random(seed)

    def measure(self: Any, cpus: set[int] | None,
                client: set[int] | None = None) -> Measured:
        label = self._arm.label
        centre = 100.0 if label == BASELINE else 100.0 * candidate_ratio
        return Measured({"decode_tps": centre * math.exp(noise.gauss(0, 0.014))},
                        {"greedy_text": "x"}, None)

    monkeypatch.setattr("harness.ab.runner._Starter.measure", measure)


def _run(tmp_path: Path, extend_s: float) -> tuple[AbOutcome, MetricDecision]:
    # Executables the runners accept; no server starts, measure is scripted. A block of
    # 12 starts is 6 pairs, enough for an interval after the first one; a budget of
    # nothing ends the comparison after it unless the extension goes on.
    arms = (Arm("baseline", binary=Path("/bin/true")), Arm("candidate", binary=Path("/bin/true")))
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", design=INTERLEAVED,
                          metrics=("decode_tps",), seed=1,
                          rule=AbRule(budget_s=1e-6, block_size=12, extend_s=extend_s))
    outcome = run_ab(*arms, settings, log_dir=tmp_path / "logs")
    return outcome, outcome.decisions[0]


def test_a_shown_slowdown_is_measured_past_the_budget_until_it_is_decided(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, 0.962, seed=7)
    stopped, first = _run(tmp_path, extend_s=0.0)
    assert first.verdict is AbVerdict.UNKNOWN
    assert worth_extending(first)
    assert stopped.blocks == 1
    assert stopped.extended_for == ()

    _scripted(monkeypatch, 0.962, seed=7)
    extended, decided = _run(tmp_path, extend_s=3600.0)
    assert decided.verdict is AbVerdict.REGRESSED
    assert extended.blocks > 1
    assert extended.extended_for == ("decode_tps",)
    assert extended.extended_s > 0
    said = outcome_json(extended)
    assert (said["extend_s"], said["extended_for"]) == (3600.0, ["decode_tps"])
    assert "for decode_tps" in table(extended)


def test_an_interval_that_holds_no_change_stops_at_the_budget(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _scripted(monkeypatch, 1.0, seed=3)
    outcome, decision = _run(tmp_path, extend_s=3600.0)
    assert decision.verdict is AbVerdict.UNKNOWN
    assert outcome.blocks == 1
    assert outcome.extended_for == ()
    assert "not needed" in table(outcome)
