"""The first-token prompt ``harness ab`` sizes from its probe start (pure)."""

from __future__ import annotations

import math

import pytest

from harness.ab.first_token import LONGEST_PROMPT, first_token_prompt, wanted_first_token_ms

FLOOR_MS = 5.0
THRESHOLD = 0.03


def _sized(ttft_ms: float | None, prompt_tps: float | None, n_prompt: int = 32) -> int:
    return first_token_prompt(n_prompt, ttft_ms, prompt_tps, floor_ms=FLOOR_MS,
                              threshold=THRESHOLD)


def test_a_fast_first_token_gets_a_prompt_long_enough_for_the_floor() -> None:
    # The bench fixture here: 16 ms at 32 tokens, about 3,200 prompt tokens a second.
    length = _sized(16.0, 3200.0)
    predicted_ms = 16.0 + (length - 32) / 3200.0 * 1000.0
    assert predicted_ms >= wanted_first_token_ms(FLOOR_MS, THRESHOLD)
    assert FLOOR_MS / predicted_ms < THRESHOLD
    # The shortest doubling that does it: half of it would not.
    assert 16.0 + (length // 2 - 32) / 3200.0 * 1000.0 < wanted_first_token_ms(
        FLOOR_MS, THRESHOLD)
    assert length == 1024


def test_a_slow_first_token_keeps_the_timed_prompt() -> None:
    # A large model on a CPU: 32 tokens already take most of a second.
    assert _sized(800.0, 40.0) == 32
    assert _sized(800.0, 40.0, n_prompt=512) == 512


def test_a_probe_without_figures_keeps_the_timed_prompt() -> None:
    assert _sized(None, 3200.0) == 32
    assert _sized(16.0, None) == 32
    assert _sized(16.0, 0.0) == 32
    assert _sized(math.nan, 3200.0) == 32
    assert _sized(16.0, math.inf) == 32


def test_the_prompt_never_passes_the_longest() -> None:
    # A very fast prompt (a small model on a large GPU) would want more than allowed.
    assert _sized(2.0, 500_000.0) == LONGEST_PROMPT
    assert _sized(2.0, 500_000.0, n_prompt=LONGEST_PROMPT) == LONGEST_PROMPT


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be above 0"):
        first_token_prompt(0, 16.0, 3200.0, floor_ms=FLOOR_MS, threshold=THRESHOLD)
    with pytest.raises(ValueError, match="must be above 0"):
        first_token_prompt(32, 16.0, 3200.0, floor_ms=FLOOR_MS, threshold=0.0)
