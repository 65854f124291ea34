"""The A/B comparison's block plans, pairing and outputs (pure: no server here).

The real-server run of ``harness ab`` is in tests/test_ab_cli.py.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from results_fixtures import make_run

from harness.ab.allure_result import write_allure_result
from harness.ab.decision import AbRule, AbVerdict, decide_metric
from harness.ab.design import (
    ALTERNATING,
    BASELINE,
    CANDIDATE,
    DUET,
    INTERLEAVED,
    Sample,
    paired_values,
    plan_block,
)
from harness.ab.report import outcome_json, record_json, table
from harness.ab.runner import AbOutcome, AbSettings, Arm, Measured, context_for, run_ab
from harness.errors import ConfigError
from harness.results.run_validation import parse_run_json


def test_interleaved_blocks_are_abba_or_baab_with_two_pairs_each() -> None:
    rng = random.Random(7)
    orders: Counter[str] = Counter()
    for number in range(200):
        block = plan_block(INTERLEAVED, number, rng)
        orders[block.order] += 1
        arms = "".join("A" if slot.arm == BASELINE else "B" for slot in block.slots)
        assert arms == block.order
        assert [slot.pair for slot in block.slots] == [2 * number, 2 * number,
                                                       2 * number + 1, 2 * number + 1]
        # Each pair holds one start of each arm.
        for pair in (2 * number, 2 * number + 1):
            assert sorted(s.arm for s in block.slots if s.pair == pair) == [BASELINE,
                                                                            CANDIDATE]
    assert set(orders) == {"ABBA", "BAAB"}
    assert 70 < orders["ABBA"] < 130, "the order is a fair coin"


def test_duet_blocks_give_the_arms_opposite_halves_by_a_coin() -> None:
    rng = random.Random(3)
    halves: Counter[int] = Counter()
    for number in range(100):
        block = plan_block(DUET, number, rng, starts=2)
        by_arm = {slot.arm: slot.half for slot in block.slots}
        assert set(by_arm.values()) == {0, 1}
        assert {slot.pair for slot in block.slots} == {number}
        baseline_half = by_arm[BASELINE]
        assert baseline_half is not None
        halves[baseline_half] += 1
    assert 30 < halves[0] < 70


def test_alternating_blocks_keep_a_pair_on_one_half_together_in_a_flipped_order() -> None:
    rng = random.Random(3)
    firsts: Counter[str] = Counter()
    halves: Counter[int | None] = Counter()
    for number in range(40):
        block = plan_block(ALTERNATING, number, rng)
        assert block.coresident
        assert not block.together
        assert len(block.slots) == 4
        for pair in (2 * number, 2 * number + 1):
            first, second = (slot for slot in block.slots if slot.pair == pair)
            assert {first.arm, second.arm} == {BASELINE, CANDIDATE}
            assert first.half == second.half
            firsts[first.arm] += 1
            halves[first.half] += 1
    # Both coins land both ways.
    assert set(firsts) == {BASELINE, CANDIDATE}
    assert set(halves) == {0, 1}


def test_a_longer_interleaved_block_is_several_quartets_numbered_on() -> None:
    rng = random.Random(11)
    for number in range(20):
        block = plan_block(INTERLEAVED, number, rng, starts=8)
        assert len(block.slots) == 8
        first, second = block.order.split("+")
        arms = "".join("A" if slot.arm == BASELINE else "B" for slot in block.slots)
        assert arms == first + second
        assert [slot.pair for slot in block.slots] == [
            4 * number, 4 * number, 4 * number + 1, 4 * number + 1,
            4 * number + 2, 4 * number + 2, 4 * number + 3, 4 * number + 3]


def test_a_duet_block_of_four_starts_is_two_pairs_each_with_its_own_coin() -> None:
    rng = random.Random(12)
    orders: Counter[str] = Counter()
    for number in range(100):
        block = plan_block(DUET, number, rng, starts=4)
        assert [slot.pair for slot in block.slots] == [2 * number] * 2 + [2 * number + 1] * 2
        for pair in (2 * number, 2 * number + 1):
            halves = {slot.arm: slot.half for slot in block.slots if slot.pair == pair}
            assert set(halves) == {BASELINE, CANDIDATE}
            assert set(halves.values()) == {0, 1}
        orders[block.order] += 1
    # Four combinations of two coins, none missing.
    assert set(orders) == {"AB+AB", "AB+BA", "BA+AB", "BA+BA"}


@pytest.mark.parametrize(("design", "starts"), [(INTERLEAVED, 2), (INTERLEAVED, 6),
                                                (DUET, 3), (DUET, 0)])
def test_a_block_of_broken_quartets_or_pairs_is_refused(design: str, starts: int) -> None:
    with pytest.raises(ValueError, match=f"{starts} starts"):
        plan_block(design, 0, random.Random(1), starts=starts)


def test_an_interleaved_comparison_refuses_a_block_of_broken_quartets(tmp_path: Path) -> None:
    # Refused before any server starts: the arms' binaries do not even exist.
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", design=INTERLEAVED,
                          rule=AbRule(block_size=6))
    with pytest.raises(ConfigError, match="block size 6: an interleaved block"):
        run_ab(Arm("baseline", binary=tmp_path / "a"), Arm("candidate", binary=tmp_path / "b"),
               settings)


def test_the_same_seed_plans_the_same_blocks() -> None:
    first = [plan_block(INTERLEAVED, n, random.Random(5)).order for n in range(3)]
    again = [plan_block(INTERLEAVED, n, random.Random(5)).order for n in range(3)]
    assert first == again


def test_an_unknown_design_is_refused() -> None:
    with pytest.raises(ValueError, match="interleaved, duet"):
        plan_block("abab", 0, random.Random(1))


def _sample(arm: str, pair: int, sequence: int, **values: float) -> Sample:
    return Sample(arm=arm, pair=pair, block=pair // 2, sequence=sequence, at_s=float(sequence),
                  values=dict(values), counters={"greedy_text": "x"})


def test_pairs_line_up_and_a_pair_missing_a_metric_is_left_out_whole() -> None:
    samples = [
        _sample(BASELINE, 0, 0, decode_tps=100.0, ttft_ms=10.0),
        _sample(CANDIDATE, 0, 1, decode_tps=90.0, ttft_ms=11.0),
        _sample(CANDIDATE, 1, 2, decode_tps=91.0),  # no ttft: the server gave none
        _sample(BASELINE, 1, 3, decode_tps=101.0, ttft_ms=10.5),
        _sample(BASELINE, 2, 4, decode_tps=99.0),  # its partner never ran
    ]
    assert paired_values(samples, "decode_tps") == ([100.0, 101.0], [90.0, 91.0])
    assert paired_values(samples, "ttft_ms") == ([10.0], [11.0])


def _outcome(tmp_path: Path, slowdown: float, pairs: int = 8) -> AbOutcome:
    rng = random.Random(11)
    samples = []
    for pair in range(pairs):
        base = 1000.0 * rng.uniform(0.98, 1.02)
        samples.append(_sample(BASELINE, pair, 2 * pair, decode_tps=base))
        samples.append(_sample(CANDIDATE, pair, 2 * pair + 1,
                               decode_tps=base * (1 - slowdown) * rng.uniform(0.995, 1.005)))
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", metrics=("decode_tps",))
    decision = decide_metric("decode_tps", *paired_values(samples, "decode_tps"), AbRule())
    return AbOutcome(baseline=Arm("baseline", binary=tmp_path / "a"),
                     candidate=Arm("candidate", binary=tmp_path / "b"), settings=settings,
                     seed=1, samples=tuple(samples), decisions=(decision,),
                     decided_after_s={"decode_tps": 12.0}, elapsed_s=12.5, blocks=4)


def test_a_clear_slowdown_is_regressed_in_every_output(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, slowdown=0.10)
    assert outcome.regressed
    text = table(outcome)
    assert "decode_tps (tokens/s)" in text
    assert "regressed" in text
    body = outcome_json(outcome)
    assert body["regressed"] is True
    assert body["metrics"][0]["verdict"] == "regressed"
    assert body["metrics"][0]["ci_high"] < 0.97
    assert [s["sequence"] for s in body["samples"]] == list(range(16))
    json.dumps(body, allow_nan=False)  # every number finite


def test_the_same_speed_is_unchanged_and_not_a_regression(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, slowdown=0.0)
    assert not outcome.regressed
    assert outcome.decisions[0].verdict == "unchanged"


def test_the_record_object_is_accepted_by_the_run_json_schema(tmp_path: Path) -> None:
    run = make_run("ab-1").to_json()
    run["ab"] = record_json(_outcome(tmp_path, slowdown=0.10))
    parsed = parse_run_json(json.dumps(run))
    assert parsed.to_json()["ab"]["metrics"]["decode_tps"]["verdict"] == "regressed"


def test_the_allure_result_has_the_verdicts_the_samples_and_a_plot(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, slowdown=0.10)
    path = write_allure_result(outcome, tmp_path / "allure-results")
    result = json.loads(path.read_text())
    assert result["status"] == "failed"
    assert "decode_tps" in result["statusDetails"]["message"]
    by_name = {a["name"]: tmp_path / "allure-results" / a["source"]
               for a in result["attachments"]}
    assert by_name["paired samples (plot)"].read_bytes().startswith(b"\x89PNG\r\n")
    rows = by_name["paired samples (table)"].read_text().splitlines()
    assert rows[0].split("\t") == ["sequence", "block", "pair", "arm", "at_s", "decode_tps"]
    assert len(rows) == 1 + len(outcome.samples)
    assert "regressed" in by_name["verdicts"].read_text()
    passed = write_allure_result(_outcome(tmp_path, slowdown=0.0), tmp_path / "more")
    assert json.loads(passed.read_text())["status"] == "passed"


def test_a_changed_counter_is_reported_with_both_values(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, slowdown=0.0)
    changed = tuple(
        replace(s, counters={**s.counters, "greedy_text": "y", "kv_mib[CPU]": "12.00"
                             if s.arm == CANDIDATE else "8.00"})
        for s in outcome.samples)
    outcome = replace(outcome, samples=changed)
    text = table(outcome)
    assert "kv_mib[CPU]" in text
    assert "8.00" in text
    assert "12.00" in text
    body = outcome_json(outcome)
    assert body["counters"]["changed"] == [
        {"name": "kv_mib[CPU]", "baseline": "8.00", "candidate": "12.00"}]
    assert record_json(outcome)["counter_changes"] == body["counters"]["changed"]


@pytest.mark.parametrize(("n_prompt", "n_gen", "context"),
                         [(32, 64, 512), (448, 64, 512), (449, 64, 1024), (1024, 64, 1536)])
def test_the_context_holds_the_prompt_and_the_generation(n_prompt: int, n_gen: int,
                                                         context: int) -> None:
    assert context_for(n_prompt, n_gen) == context
    settings = AbSettings(model=Path("m.gguf"), fixture="bench", n_prompt=n_prompt,
                          n_gen=n_gen)
    assert settings.context() == context
    assert AbSettings(model=Path("m.gguf"), fixture="bench", ctx_size=4096).context() == 4096


def test_a_continued_comparison_keeps_its_pairs_and_numbers_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control flow of ``resume`` (the bisect's later rounds): the measurements are
    scripted, alternating so that no verdict is reached, and each call gets one block."""
    values = iter([100.0, 104.0, 110.0, 96.0] * 50)

    def measure(self: object, cpus: set[int] | None,
                client: set[int] | None = None) -> Measured:
        return Measured({"decode_tps": next(values)}, {"greedy_text": "x"}, None)

    monkeypatch.setattr("harness.ab.runner._Starter.measure", measure)
    # Executables the runners accept; no server starts, measure is scripted.
    arms = (Arm("baseline", binary=Path("/bin/true")), Arm("candidate", binary=Path("/bin/false")))
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", design=INTERLEAVED,
                          metrics=("decode_tps",), rule=AbRule(budget_s=1e-6), seed=1)
    first = run_ab(*arms, settings, log_dir=tmp_path / "logs")
    assert first.blocks == 1
    assert first.decisions[0].verdict is AbVerdict.UNKNOWN
    more = replace(settings, rule=AbRule(budget_s=first.elapsed_s + 1e-6))
    again = run_ab(*arms, more, log_dir=tmp_path / "logs", resume=first)
    assert again.blocks == 2
    assert again.samples[:len(first.samples)] == first.samples
    assert [s.sequence for s in again.samples] == list(range(len(again.samples)))
    assert len({s.pair for s in again.samples}) == 2 * len({s.pair for s in first.samples})
    assert again.decisions[0].pairs == 2 * first.decisions[0].pairs
    with pytest.raises(ValueError, match="its own arms"):
        run_ab(arms[1], arms[0], more, log_dir=tmp_path / "logs", resume=first)


@pytest.mark.parametrize(("ttft_at_choice", "expected"), [(300.0, 1024), (165.0, 2048)])
def test_a_lengthened_first_token_prompt_is_measured_and_doubled_while_short(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ttft_at_choice: float,
        expected: int) -> None:
    """The probe's 32-token figures predict 1024 tokens (tests/test_ab_first_token.py);
    a start at 1024 then measures the first token: 165 ms (seen in CI, where 250 ms was
    wanted) doubles the prompt, 300 ms keeps it."""
    asked: list[int | None] = []

    def measure(self: Any, cpus: set[int] | None,
                client: set[int] | None = None) -> Measured:
        asked.append(self._settings.ttft_prompt)
        if self._settings.ttft_prompt is None:
            return Measured({"ttft_ms": 16.0, "prompt_tps": 3200.0, "decode_tps": 100.0},
                            {}, None)
        return Measured({"ttft_ms": ttft_at_choice, "decode_tps": 100.0}, {}, None)

    monkeypatch.setattr("harness.ab.runner._Starter.measure", measure)
    arms = (Arm("baseline", binary=Path("/bin/true")), Arm("candidate", binary=Path("/bin/true")))
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", design=INTERLEAVED,
                          metrics=("ttft_ms",), rule=AbRule(budget_s=1e-6), seed=1)
    outcome = run_ab(*arms, settings, log_dir=tmp_path / "logs")
    assert outcome.settings.ttft_prompt == expected
    assert asked[:2] == [None, 1024]
