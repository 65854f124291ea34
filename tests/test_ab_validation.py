"""Which A/B designs a runner trusts, and "unchanged" that must be earned (pure).

The real-server side — ``harness ab --calibrate-design`` and ``--design auto`` reading
its record — is in tests/test_ab_cli.py.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from pathlib import Path

import pytest

from harness.ab.decision import AbVerdict, MetricDecision
from harness.ab.design import BASELINE, DUET, INTERLEAVED, SEQUENTIAL, plan_block
from harness.ab.design_check import CALIBRATING_KINDS, VALIDATION_ENV, amount_for, load_validation
from harness.ab.stats import RatioInterval
from harness.ab.validation import (
    DesignCheck,
    ValidationRecord,
    auto_design,
    earn_unchanged,
    effect,
    keeps_effect,
    record_for,
    record_from_json,
    validated_metrics,
)
from harness.errors import ConfigError
from harness.facts.build import Backend


def test_a_sequential_pair_runs_one_arm_after_the_other_on_one_half() -> None:
    rng = random.Random(5)
    orders: Counter[str] = Counter()
    halves: Counter[int] = Counter()
    for number in range(200):
        block = plan_block(SEQUENTIAL, number, rng, starts=2)
        assert not block.together
        (pair,) = {slot.pair for slot in block.slots}
        assert pair == number
        assert {slot.half for slot in block.slots} in ({0}, {1})
        order = "".join("A" if slot.arm == BASELINE else "B" for slot in block.slots)
        assert order == block.order
        orders[order] += 1
        half = block.slots[0].half
        assert half is not None
        halves[half] += 1
    assert set(orders) == {"AB", "BA"}
    assert 70 < orders["AB"] < 130, "the order is a fair coin"
    assert 70 < halves[0] < 130, "so is the half"
    assert plan_block(DUET, 0, random.Random(1), starts=2).together


def _decision(metric: str, verdict: AbVerdict) -> MetricDecision:
    return MetricDecision(metric=metric, verdict=verdict,
                          interval=RatioInterval(1.0, 0.99, 1.01, 0.95, 8),
                          baseline_median=100.0, candidate_median=100.0, pairs=8)


def test_an_unearned_unchanged_is_unknown_with_the_reason_and_nothing_else_moves() -> None:
    decisions = (_decision("decode_tps", AbVerdict.UNCHANGED),
                 _decision("load_s", AbVerdict.UNCHANGED),
                 _decision("ttft_ms", AbVerdict.REGRESSED),
                 _decision("prompt_tps", AbVerdict.IMPROVED))
    earned = [earn_unchanged(d, DUET, frozenset({"load_s"}), "calibrate it")
              for d in decisions]
    assert [d.verdict for d in earned] == [AbVerdict.UNKNOWN, AbVerdict.UNCHANGED,
                                           AbVerdict.REGRESSED, AbVerdict.IMPROVED]
    reason = earned[0].reason
    assert reason is not None
    assert "duet design was not shown to see a change of decode_tps" in reason
    assert reason.endswith("calibrate it")
    assert [d.reason for d in earned[1:]] == [None, None, None]


def test_keeping_an_effect_is_within_a_fifth_of_the_solo_one() -> None:
    assert keeps_effect(0.09, 0.10)
    assert keeps_effect(0.12, 0.10)
    assert not keeps_effect(0.075, 0.10)  # compressed by a quarter
    assert not keeps_effect(0.002, 0.04)  # the reported duet "unchanged" of a real 4 %
    assert not keeps_effect(0.0, 0.0)  # no change injected: nothing is shown
    assert effect(0.9, higher_is_better=True) == pytest.approx(0.1)
    assert effect(1.1, higher_is_better=False) == pytest.approx(1 - 1 / 1.1)


def _record(*checks: tuple[str, str, float]) -> ValidationRecord:
    return ValidationRecord(host="vm", date="2026-12-01T00:00:00Z", builds=("a", "b"),
                            checks=tuple(DesignCheck(design, metric, 0.10, measured, 8)
                                         for design, metric, measured in checks))


def test_auto_takes_the_fastest_design_validated_for_every_metric_else_sequential() -> None:
    record = _record((DUET, "decode_tps", 0.10), (INTERLEAVED, "decode_tps", 0.095),
                     (INTERLEAVED, "load_s", 0.10), (DUET, "load_s", 0.02))
    assert auto_design(("decode_tps",), record, host_processes=True) == DUET
    assert auto_design(("decode_tps", "load_s"), record, host_processes=True) == INTERLEAVED
    assert auto_design(("ttft_ms",), record, host_processes=True) == SEQUENTIAL
    assert auto_design(("decode_tps",), None, host_processes=True) == SEQUENTIAL
    assert auto_design(("decode_tps",), record, host_processes=False) == INTERLEAVED
    assert validated_metrics(SEQUENTIAL, ("decode_tps", "load_s"), None) == {"decode_tps",
                                                                             "load_s"}
    assert validated_metrics(DUET, ("decode_tps", "load_s"), record) == {"decode_tps"}


def test_a_record_reads_back_and_a_damaged_one_names_the_fix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = _record((DUET, "decode_tps", 0.10))
    assert record_from_json(json.loads(json.dumps(record.to_json()))) == record
    path = tmp_path / "validation.json"
    monkeypatch.setenv(VALIDATION_ENV, str(path))
    assert load_validation(tmp_path) is None  # none yet: no design but sequential is trusted
    path.write_text(json.dumps(record.to_json()))
    assert load_validation(tmp_path) == record
    path.write_text('{"host": "vm", "checks": "no"}')
    with pytest.raises(ConfigError, match=r"validation.json: not a design validation "
                                          r"record.*--calibrate-design"):
        load_validation(tmp_path)
    bad = {**record.to_json(), "checks": [{**record.to_json()["checks"][0],  # type: ignore[index]
                                           "design": "abab"}]}
    with pytest.raises(ValueError, match="outside"):
        record_from_json(bad)


def test_each_calibrated_metric_has_a_kind_sized_to_the_asked_change() -> None:
    assert CALIBRATING_KINDS == {"decode_tps": "decode-wait", "prompt_tps": "prompt",
                                 "ttft_ms": "first-token"}
    # 100 tokens/s is 10 ms a token; 10 % fewer tokens a second is 11.11 ms.
    assert amount_for("decode-wait", 0.10, 100.0) == 1111
    assert amount_for("prompt", 0.10, 1000.0) == 111
    # A 20 ms first token made 10 % worse (ratio 1/0.9) waits 2.22 ms more.
    assert amount_for("first-token", 0.10, 20.0) == 2222
    with pytest.raises(ConfigError):
        amount_for("prompt", 0.10, 0.0)


def test_a_cpu_calibration_is_never_used_for_gpu_builds() -> None:
    record = _record((DUET, "decode_tps", 0.10))
    assert record_for(record, [Backend.CPU, Backend.CPU]) is record
    for other in (Backend.CUDA, Backend.ROCM, Backend.VULKAN, None):
        assert record_for(record, [Backend.CPU, other]) is None
    # So auto on two CUDA builds stays sequential: one server on the GPU at a time.
    assert auto_design(("decode_tps",), record_for(record, [Backend.CUDA, Backend.CUDA]),
                       host_processes=True) == SEQUENTIAL
