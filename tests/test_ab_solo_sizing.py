"""The detection benchmark's second sizing of a decode wait from what it cost solo
(benchmarks/ab_solo_sizing.py): only where the solo interval settles away from the
level, and then to the wait the measured cost per µs says makes the level."""

from __future__ import annotations

from types import ModuleType

import pytest
from benchmark_modules import load_benchmark

from harness.builds.slowed import slowdown_of_wait, wait_for_slowdown

SPEED = 600.0  # tokens/s of the baseline: 1667 µs a token


@pytest.fixture(scope="module")
def sizing() -> ModuleType:
    return load_benchmark("ab_solo_sizing")


def pairs_costing(extra_us: float, spread_us: float = 2.0,
                  n: int = 40) -> list[tuple[float, float]]:
    """Solo pairs whose candidate token took ``extra_us`` longer, give or take up to twice
    ``spread_us`` (so the interval has a width)."""
    return [(SPEED, 1e6 / (1e6 / SPEED + extra_us + spread_us * ((index % 5) - 2)))
            for index in range(n)]


def test_a_wait_that_cost_its_length_is_kept(sizing: ModuleType) -> None:
    wait = wait_for_slowdown(0.04, SPEED)
    assert sizing.resized_wait(wait, 0.04, pairs_costing(wait)) is None


def test_a_wait_that_cost_half_again_its_length_is_scaled_down(sizing: ModuleType) -> None:
    wait = wait_for_slowdown(0.04, SPEED)
    solo = pairs_costing(1.5 * wait)
    assert slowdown_of_wait(1.5 * wait, SPEED) > 0.055  # settled well away from 4 %
    resized = sizing.resized_wait(wait, 0.04, solo)
    assert resized == pytest.approx(wait / 1.5, abs=1)
    # At the measured 1.5 µs a µs, the new wait costs what the level's wait should.
    assert slowdown_of_wait(1.5 * resized, SPEED) == pytest.approx(0.04, abs=0.001)


def test_a_wait_that_cost_too_little_is_scaled_up(sizing: ModuleType) -> None:
    wait = wait_for_slowdown(0.05, SPEED)
    resized = sizing.resized_wait(wait, 0.05, pairs_costing(0.5 * wait))
    assert resized == pytest.approx(2 * wait, abs=1)


def test_a_solo_run_too_short_or_too_noisy_to_settle_keeps_the_wait(
        sizing: ModuleType) -> None:
    wait = wait_for_slowdown(0.04, SPEED)
    assert sizing.resized_wait(wait, 0.04, pairs_costing(1.5 * wait, n=5)) is None
    # Pairs that scatter by ±120 µs a token: the interval holds 4 % as well as 6 %.
    assert sizing.resized_wait(wait, 0.04, pairs_costing(1.5 * wait, spread_us=60)) is None


def test_a_wait_that_cost_nothing_is_not_scaled_to_infinity(sizing: ModuleType) -> None:
    wait = wait_for_slowdown(0.04, SPEED)
    assert sizing.resized_wait(wait, 0.04, pairs_costing(0.0)) is None
