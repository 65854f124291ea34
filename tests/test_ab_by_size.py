"""The detection benchmark's count of decode-wait decisions by the size each wait made at
its own decision (benchmarks/ab_by_size.py): the same wait is a larger share of a faster
token, so two decisions of one level can land in different bands."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest
from benchmark_modules import load_benchmark

from harness.builds.slowed import slowdown_of_wait


@pytest.fixture(scope="module")
def by_size() -> ModuleType:
    return load_benchmark("ab_by_size")


def _decision(amount: int, baseline_tps: float, verdict: str,
              decided_after_s: float | None = 40.0) -> dict[str, Any]:
    # Candidate figures far from any construction: the size must not come from them.
    pairs = [[baseline_tps, baseline_tps * 0.5], [baseline_tps * 1.01, 1.0]]
    return {"design": "alternating", "amount": amount, "verdict": verdict,
            "decided_after_s": decided_after_s, "pairs": {"decode_tps": pairs}}


def test_the_size_at_a_decision_comes_from_its_baseline_speed_alone(
        by_size: ModuleType) -> None:
    decision = _decision(68, 500.0, "regressed")
    expected = (slowdown_of_wait(68, 500.0) + slowdown_of_wait(68, 505.0)) / 2
    assert by_size.constructed_at(decision, "decode_tps") == pytest.approx(expected)
    assert by_size.constructed_at({"amount": 68, "pairs": {}}, "decode_tps") is None


def test_one_wait_lands_in_the_band_of_the_speed_it_ran_at(by_size: ModuleType) -> None:
    # 68 µs a token: 3.3 % of a 500 tokens/s decode, 4.8 % of a 740 tokens/s one.
    decisions = [_decision(68, 500.0, "regressed"), _decision(68, 500.0, "unknown", None),
                 _decision(68, 740.0, "regressed", 20.0)]
    rows = by_size.by_size_rows(decisions, "decode_tps", lambda d: d["verdict"])
    assert len(rows) == 2
    three, five = rows
    assert three.startswith("| 3% (2.5% to 3.5%) | alternating | 2 | 1/2 ")
    assert "| 0 | 1 |" in three  # no unchanged, one unknown
    assert three.endswith("| 40 s |")  # the undecided one has no decision time
    assert five.startswith("| 5% (4.5% to 5.5%) | alternating | 1 | 1/1 ")


def test_a_decision_without_pairs_is_left_out(by_size: ModuleType) -> None:
    empty = {"design": "alternating", "amount": 68, "decided_after_s": None, "pairs": {}}
    assert by_size.by_size_rows([empty], "decode_tps", lambda d: "unknown") == []
