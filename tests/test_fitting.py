"""VRAM fitting: slots at a context, context at a slot count, caps and reasons.

The worked examples are reference 001's "parallel slot derivation" (docs/references.md):
KV KiB per token per bundle and cache types, model sizes in GiB, 3 GiB headroom on 24 GB
cards, 4 GiB on the 5090.
"""

from __future__ import annotations

import pytest

from harness.errors import ConfigError
from harness.planning.fitting import (
    GIB,
    KV_PAD_TOKENS,
    FitInputs,
    Limit,
    floor_context,
    max_context_at,
    max_slots_at,
    pad_context,
)

KIB = 1024


def _inputs(
    vram_gib: int, headroom_gib: int, weights_gib: float, kv_kib_per_token: int,
    max_parallel: int, max_ctx: int = 1048576, drafter_bytes: int = 0,
) -> FitInputs:
    return FitInputs(
        vram_mib=vram_gib * 1024, reserved_headroom_mib=headroom_gib * 1024,
        weights_bytes=int(weights_gib * GIB), drafter_bytes=drafter_bytes,
        kv_bytes_per_token=kv_kib_per_token * KIB, max_parallel=max_parallel,
        max_ctx_size=max_ctx,
    )


@pytest.mark.parametrize(
    ("inputs", "ctx", "slots", "limit"),
    [
        # 3090, 2B, Q8K/Q4V 88 KiB/token: 19.5 GiB / 2.75 GiB per slot at 32k = 7.
        pytest.param(_inputs(24, 3, 1.5, 88, 8), 32768, 7, Limit.VRAM, id="3090-2b-32k"),
        # 3090, 9B, 150 KiB/token: 15.6 GiB / 9.4 GiB per slot at 64k = 1; at 32k = 3.
        pytest.param(_inputs(24, 3, 5.4, 150, 8), 65536, 1, Limit.VRAM, id="3090-9b-64k"),
        pytest.param(_inputs(24, 3, 5.4, 150, 8), 32768, 3, Limit.VRAM, id="3090-9b-32k"),
        # 3090, 27B, QJL+Polar 62 KiB/token: 4.2 GiB / 2 GiB per slot at 32k = 2.
        pytest.param(_inputs(24, 3, 16.8, 62, 8), 32768, 2, Limit.VRAM, id="3090-27b-32k"),
        # 4090, 2B, QJL+Polar 28 KiB/token: 22 by VRAM, capped at 16.
        pytest.param(_inputs(24, 3, 1.5, 28, 16), 32768, 16, Limit.PARALLEL_CAP,
                     id="4090-2b-capped"),
        # 5090, 27B at 128k: 8 GiB per slot -> 1.
        pytest.param(_inputs(32, 4, 16.8, 62, 24), 131072, 1, Limit.VRAM, id="5090-27b-128k"),
    ],
)
def test_most_slots_at_a_context_follows_reference_001(
    inputs: FitInputs, ctx: int, slots: int, limit: Limit,
) -> None:
    fit = max_slots_at(inputs, ctx)
    assert (fit.slots, fit.limited_by, fit.fits) == (slots, limit, True)
    assert fit.ctx_per_slot == ctx
    assert fit.ctx_size == slots * ctx
    assert fit.kv_bytes == slots * ctx * inputs.kv_bytes_per_token
    assert fit.kv_bytes <= fit.budget_bytes == inputs.kv_budget_bytes
    assert fit.reason.startswith(f"{slots} slots at {ctx} tokens: KV budget ")
    assert f"{inputs.kv_bytes_per_token} B" in fit.reason


def test_slots_reason_names_every_size() -> None:
    fit = max_slots_at(_inputs(24, 3, 1.5, 88, 8), 32768)
    assert fit.reason == (
        "7 slots at 32768 tokens: KV budget 19.50 GiB = 24.00 GiB VRAM - 3.00 GiB headroom"
        " - 1.50 GiB weights - 0.00 GiB drafter; 2.75 GiB per slot (32768 tokens x 90112 B)"
        " -> 7 slots by VRAM"
    )
    capped = max_slots_at(_inputs(24, 3, 1.5, 28, 16), 32768)
    assert capped.reason.endswith("-> 22 slots by VRAM, capped at max_parallel 16")


def test_the_drafter_takes_from_the_kv_budget() -> None:
    without = max_slots_at(_inputs(24, 3, 1.5, 88, 8), 32768)
    drafter = max_slots_at(_inputs(24, 3, 1.5, 88, 8, drafter_bytes=GIB), 32768)
    assert (without.slots, drafter.slots) == (7, 6)
    assert "1.00 GiB drafter" in drafter.reason


def test_a_context_is_priced_at_its_padded_size() -> None:
    fit = max_slots_at(_inputs(24, 3, 1.5, 88, 8), 32769)
    assert fit.ctx_per_slot == 32768 + KV_PAD_TOKENS
    assert "(padded up from 32769)" in fit.reason


def test_no_budget_when_the_weights_do_not_fit() -> None:
    inputs = _inputs(24, 3, 30.0, 62, 8)
    for fit in (max_slots_at(inputs, 4096), max_context_at(inputs, 1)):
        assert fit.limited_by is Limit.NO_BUDGET
        assert not fit.fits
        assert fit.budget_bytes < 0
        assert "30.00 GiB weights" in fit.reason


def test_a_context_above_the_card_cap_gets_no_slots() -> None:
    fit = max_slots_at(_inputs(141, 6, 1.5, 28, 64, max_ctx=1048576), 2097152)
    assert (fit.slots, fit.limited_by) == (0, Limit.CONTEXT_CAP)
    assert "above the card's max_ctx_size 1048576" in fit.reason


@pytest.mark.parametrize(
    ("inputs", "slots", "ctx", "limit"),
    [
        # 5090, 27B, one slot: 11.2 GiB / 62 KiB per token = 189420 -> 189184 (x256).
        pytest.param(_inputs(32, 4, 16.8, 62, 24, max_ctx=262144), 1, 189184, Limit.VRAM,
                     id="5090-27b-1-slot"),
        # 3090, 2B, 7 slots: 19.5 GiB / (7 x 88 KiB) = 33243 -> 33024.
        pytest.param(_inputs(24, 3, 1.5, 88, 8, max_ctx=65536), 7, 33024, Limit.VRAM,
                     id="3090-2b-7-slots"),
        # H200, 2B, 1 slot: VRAM allows millions of tokens; the card caps at 1M.
        pytest.param(_inputs(141, 6, 1.5, 28, 64, max_ctx=1048576), 1, 1048576,
                     Limit.CONTEXT_CAP, id="h200-capped"),
    ],
)
def test_longest_context_at_a_slot_count(
    inputs: FitInputs, slots: int, ctx: int, limit: Limit,
) -> None:
    fit = max_context_at(inputs, slots)
    assert (fit.ctx_per_slot, fit.limited_by, fit.slots) == (ctx, limit, slots)
    assert fit.ctx_per_slot % KV_PAD_TOKENS == 0
    assert fit.ctx_size == slots * ctx
    assert fit.kv_bytes <= fit.budget_bytes
    # One more padding step would not fit (unless the cap stopped it).
    if limit is Limit.VRAM:
        assert slots * (ctx + KV_PAD_TOKENS) * inputs.kv_bytes_per_token > fit.budget_bytes
    assert fit.reason.startswith(f"{ctx} tokens per slot for {slots} slots: KV budget ")


def test_slots_above_the_parallel_cap_get_no_context() -> None:
    fit = max_context_at(_inputs(24, 3, 1.5, 88, 8), 9)
    assert (fit.ctx_per_slot, fit.limited_by, fit.fits) == (0, Limit.PARALLEL_CAP, False)
    assert "9 slots is above the card's max_parallel 8" in fit.reason


def test_less_than_one_padding_step_is_no_context() -> None:
    inputs = FitInputs(vram_mib=4096, reserved_headroom_mib=3072, weights_bytes=0,
                       drafter_bytes=0, kv_bytes_per_token=8 * 1024 * 1024,
                       max_parallel=4, max_ctx_size=65536)
    fit = max_context_at(inputs, 1)
    assert (fit.ctx_per_slot, fit.fits) == (0, False)
    assert f"fewer than {KV_PAD_TOKENS} tokens per slot fit" in fit.reason


def test_a_kv_cache_that_costs_nothing_is_bounded_by_the_caps() -> None:
    inputs = _inputs(24, 3, 1.5, 0, 8, max_ctx=65536)
    assert max_slots_at(inputs, 4096).slots == 8
    assert max_context_at(inputs, 2).ctx_per_slot == 65536


@pytest.mark.parametrize(
    ("tokens", "padded", "floored"),
    [
        pytest.param(1, 256, 0, id="one"),
        pytest.param(256, 256, 256, id="exact"),
        pytest.param(257, 512, 256, id="just-over"),
        pytest.param(65535, 65536, 65280, id="just-under"),
    ],
)
def test_padding_helpers(tokens: int, padded: int, floored: int) -> None:
    assert (pad_context(tokens), floor_context(tokens)) == (padded, floored)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"vram_mib": -1}, "vram_mib=-1 is not allowed", id="negative-vram"),
        pytest.param({"weights_bytes": 1.5}, "weights_bytes=1.5 is not allowed",
                     id="float-weights"),
        pytest.param({"max_parallel": 0}, "max_parallel=0 is not allowed", id="zero-cap"),
        pytest.param({"kv_bytes_per_token": True}, "kv_bytes_per_token=True",
                     id="bool-kv"),
    ],
)
def test_bad_inputs_are_config_errors(kwargs: dict[str, object], message: str) -> None:
    values: dict[str, object] = {
        "vram_mib": 24576, "reserved_headroom_mib": 3072, "weights_bytes": 0,
        "drafter_bytes": 0, "kv_bytes_per_token": 1024, "max_parallel": 8,
        "max_ctx_size": 65536, **kwargs,
    }
    with pytest.raises(ConfigError, match=message):
        FitInputs(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [0, -5, True], ids=["zero", "negative", "bool"])
def test_bad_context_or_slot_count(value: int) -> None:
    inputs = _inputs(24, 3, 1.5, 88, 8)
    with pytest.raises(ConfigError, match="is not allowed"):
        max_slots_at(inputs, value)
    with pytest.raises(ConfigError, match="is not allowed"):
        max_context_at(inputs, value)
