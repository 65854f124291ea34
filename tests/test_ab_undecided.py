"""An undecided A/B comparison is its own state: what would decide it (pure), and how the
table, the JSON, the run record, the Allure result and ``harness ab``'s exit status say it.

The outcomes here are built from decisions with known intervals, so each output can be
checked against the numbers; no server starts. The CLI test replaces only the command's
I/O seams (resolving the builds, the fixture model, the measuring) with the outcome.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from results_fixtures import make_run

from harness import modelgen
from harness.ab.allure_result import status_of, write_allure_result
from harness.ab.decision import MetricDecision
from harness.ab.design import BASELINE, CANDIDATE, Sample
from harness.ab.design_check import VALIDATION_ENV
from harness.ab.report import outcome_json, record_json, table, undecided
from harness.ab.runner import AbOutcome, AbSettings, Arm
from harness.ab.stats import RatioInterval
from harness.ab.undecided import (
    ON_EDGE,
    band_edges,
    pairs_to_clear,
    straddled_edge,
    undecided_metrics,
    would_decide,
)
from harness.commands import ab as ab_command_module
from harness.commands.ab import EXIT_DECIDED, EXIT_FAILED, EXIT_UNDECIDED, exit_status
from harness.results.rules import AbVerdict
from harness.results.run_validation import parse_run_json

#: The issue's first comparison: 68 pairs in 175 s, 0.947 [0.922, 0.976] at 3 %.
ISSUE = RatioInterval(ratio=0.947, low=0.922, high=0.976, confidence=0.95, pairs=68)
ISSUE_SECONDS = 175.0


def _decision(verdict: AbVerdict, interval: RatioInterval | None = ISSUE, *,
              metric: str = "decode_tps", pairs: int | None = None,
              reason: str | None = None, settled: bool = False,
              threshold: float = 0.03) -> MetricDecision:
    return MetricDecision(
        metric=metric, verdict=verdict, interval=interval, baseline_median=100.0,
        candidate_median=94.7,
        pairs=pairs if pairs is not None else (interval.pairs if interval else 0),
        threshold=threshold, reason=reason, settled=settled)


def _outcome(tmp_path: Path, *decisions: MetricDecision,
             elapsed_s: float = ISSUE_SECONDS) -> AbOutcome:
    metrics = tuple(d.metric for d in decisions)
    samples = []
    for pair in range(4):
        values = {metric: 100.0 + pair for metric in metrics}
        for offset, arm in enumerate((BASELINE, CANDIDATE)):
            samples.append(Sample(arm=arm, pair=pair, block=pair // 2,
                                  sequence=2 * pair + offset, at_s=float(2 * pair + offset),
                                  values=dict(values), counters={"greedy_text": "x"}))
    settings = AbSettings(model=tmp_path / "m.gguf", fixture="bench", metrics=metrics)
    return AbOutcome(baseline=Arm("baseline", binary=tmp_path / "a"),
                     candidate=Arm("candidate", binary=tmp_path / "b"), settings=settings,
                     seed=1, samples=tuple(samples), decisions=decisions,
                     decided_after_s={d.metric: 30.0 for d in decisions
                                      if d.verdict is not AbVerdict.UNKNOWN},
                     elapsed_s=elapsed_s, blocks=34)


# -- what would decide it (pure) ---------------------------------------------------------

def test_the_pairs_needed_follow_the_half_width_shrinking_as_one_over_root_pairs() -> None:
    low_edge, _ = band_edges(0.03)
    half = (math.log(ISSUE.high) - math.log(ISSUE.low)) / 2
    distance = math.log(ISSUE.ratio) - math.log(low_edge.value)
    total = pairs_to_clear(ISSUE, low_edge)
    assert total == pytest.approx(68 * (half / distance) ** 2)
    assert 95 < (total or 0) < 97  # the issue's comparison: about 28 more pairs
    # Half the distance to the edge at the same spread: four times the pairs.
    nearer = RatioInterval(ratio=math.exp(math.log(low_edge.value) + distance / 2),
                           low=ISSUE.low, high=ISSUE.high, confidence=0.95, pairs=68)
    assert pairs_to_clear(nearer, low_edge) == pytest.approx(4 * (total or 0))


def test_the_estimate_names_the_edge_the_pairs_and_their_time() -> None:
    said = would_decide(_decision(AbVerdict.UNKNOWN), ISSUE_SECONDS / 68, min_pairs=6)
    assert said == ("it straddles the band's lower edge 0.970: about 28 more pairs "
                    "(≈ 72 s at this rate) would clear it")


@pytest.mark.parametrize(("ratio", "low", "high", "edge"), [
    # Inside the band, straddling both edges: the nearer one decides "unchanged".
    (0.99, 0.96, 1.04, "lower"),
    (1.02, 0.96, 1.04, "upper"),
    # Asymmetric: nearer the lower edge, but only the upper one is straddled.
    (0.975, 0.972, 1.04, "upper"),
    # Beyond the band: the edge on its side.
    (1.05, 1.02, 1.08, "upper"),
])
def test_the_edge_is_the_straddled_one_nearest_the_ratio(ratio: float, low: float,
                                                         high: float, edge: str) -> None:
    found = straddled_edge(RatioInterval(ratio, low, high, 0.95, 20), 0.03)
    assert found.lower == (edge == "lower")
    assert found.value == pytest.approx(0.97 if edge == "lower" else 1 / 0.97)


def test_a_ratio_on_the_edge_cannot_be_settled_by_more_pairs() -> None:
    on_edge = RatioInterval(ratio=0.97 * math.exp(ON_EDGE / 2), low=0.95, high=0.99,
                            confidence=0.95, pairs=40)
    assert pairs_to_clear(on_edge, band_edges(0.03)[0]) is None
    said = would_decide(_decision(AbVerdict.UNKNOWN, on_edge), 2.5, min_pairs=6)
    assert said == ("its ratio 0.970 sits on the band's lower edge 0.970: more pairs "
                    "cannot settle it, the change is at the threshold itself")


def test_too_few_pairs_ask_for_the_rest_of_the_minimum() -> None:
    said = would_decide(_decision(AbVerdict.UNKNOWN, None, pairs=4), 5.0, min_pairs=6)
    assert said == ("at least 2 more pairs (≈ 10 s at this rate): no verdict from fewer "
                    "than 6 pairs")
    # Without a pair there is no rate to price them at.
    assert would_decide(_decision(AbVerdict.UNKNOWN, None, pairs=0), None, min_pairs=6) \
        .startswith("at least 6 more pairs: ")


def test_an_unearned_unchanged_and_a_floor_say_more_pairs_will_not_do() -> None:
    inside = RatioInterval(1.001, 0.99, 1.012, 0.95, 20)
    unearned = _decision(AbVerdict.UNKNOWN, inside, reason="the duet design was not shown")
    said = would_decide(unearned, 2.0, min_pairs=6)
    assert said.startswith("more pairs cannot make it unchanged")
    assert "harness ab --calibrate-design" in said
    floor = _decision(AbVerdict.UNKNOWN, inside, metric="load_s", reason="under the floor",
                      settled=True)
    assert would_decide(floor, 2.0, min_pairs=6) == (
        "more pairs will not: the change is under load_s's floor; measure where the "
        "metric is larger (a model that loads for longer: `harness ab --fixture NAME`)")


def test_undecided_means_unknown_and_not_settled_and_never_beside_a_failure() -> None:
    decisions = [_decision(AbVerdict.UNKNOWN),
                 _decision(AbVerdict.UNCHANGED, metric="prompt_tps"),
                 _decision(AbVerdict.UNKNOWN, metric="load_s", reason="floor", settled=True)]
    assert undecided_metrics(decisions, failed=False) == ["decode_tps"]
    assert undecided_metrics(decisions, failed=True) == []
    assert undecided_metrics(decisions[1:], failed=False) == []


# -- the outputs --------------------------------------------------------------------------

def _floor_reason() -> str:
    return "a real change, but smaller than load_s's floor"


def test_the_table_ends_with_an_undecided_line_per_undecided_metric(tmp_path: Path) -> None:
    outcome = _outcome(
        tmp_path, _decision(AbVerdict.UNKNOWN),
        _decision(AbVerdict.UNCHANGED, RatioInterval(1.0, 0.99, 1.01, 0.95, 68),
                  metric="prompt_tps"),
        _decision(AbVerdict.UNKNOWN, RatioInterval(1.2, 1.1, 1.3, 0.95, 68), metric="load_s",
                  reason=_floor_reason(), settled=True, threshold=0.45))
    text = table(outcome)
    assert text.splitlines()[-1] == (
        "undecided: decode_tps: ratio 0.947, 95% interval [0.922, 0.976] (band ±3.0%); it "
        "straddles the band's lower edge 0.970: about 28 more pairs (≈ 72 s at this rate) "
        "would clear it")
    assert sum(line.startswith("undecided:") for line in text.splitlines()) == 1
    # The settled unknown keeps its reason line and is not undecided.
    assert f"load_s unknown: {_floor_reason()}" in text
    assert undecided(outcome) == ["decode_tps"]
    assert exit_status(outcome) == EXIT_UNDECIDED


def test_a_regression_decides_the_comparison_whatever_is_unknown(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, _decision(AbVerdict.REGRESSED,
                                           RatioInterval(0.9, 0.88, 0.92, 0.95, 20)),
                       _decision(AbVerdict.UNKNOWN, metric="prompt_tps"))
    assert undecided(outcome) == []
    assert "undecided:" not in table(outcome)
    assert exit_status(outcome) == EXIT_FAILED
    assert record_json(outcome)["undecided"] == []
    status, details = status_of(outcome)
    assert (status, details) == ("failed", {"message": "regressed: decode_tps"})


def test_every_metric_decided_is_exit_0(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, _decision(AbVerdict.UNCHANGED,
                                           RatioInterval(1.0, 0.99, 1.01, 0.95, 20)))
    assert exit_status(outcome) == EXIT_DECIDED
    assert status_of(outcome) == ("passed", {})


def test_the_json_and_the_record_name_the_undecided_and_what_would_decide_them(
        tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, _decision(AbVerdict.UNKNOWN),
                       _decision(AbVerdict.UNCHANGED, RatioInterval(1.0, 0.99, 1.01, 0.95, 68),
                                 metric="prompt_tps"))
    body = outcome_json(outcome)
    assert body["undecided"] == ["decode_tps"]
    by_metric = {m["metric"]: m for m in body["metrics"]}
    assert "about 28 more pairs" in by_metric["decode_tps"]["would_decide"]
    assert by_metric["prompt_tps"]["would_decide"] is None
    record = record_json(outcome)
    assert record["undecided"] == ["decode_tps"]
    assert record["metrics"]["decode_tps"]["would_decide"] == \
        by_metric["decode_tps"]["would_decide"]
    assert "would_decide" not in record["metrics"]["prompt_tps"]
    # Through the run.json schema and parser, both kept.
    run = make_run("ab-undecided").to_json()
    run["ab"] = record
    parsed = parse_run_json(json.dumps(run, allow_nan=False)).ab
    assert parsed is not None
    assert parsed["undecided"] == ["decode_tps"]
    assert parsed["metrics"]["decode_tps"]["would_decide"] == \
        record["metrics"]["decode_tps"]["would_decide"]


def test_a_record_from_before_the_undecided_state_still_validates(tmp_path: Path) -> None:
    record: dict[str, Any] = record_json(_outcome(tmp_path, _decision(AbVerdict.UNKNOWN)))
    del record["undecided"], record["metrics"]["decode_tps"]["would_decide"]
    run = make_run("old-ab").to_json()
    run["ab"] = record
    parsed = parse_run_json(json.dumps(run, allow_nan=False)).ab
    assert parsed is not None
    assert "undecided" not in parsed
    # A metric the harness does not define is refused in the list, as in the metrics.
    run["ab"] = {**record, "undecided": ["no_such_metric"]}
    with pytest.raises(ValueError, match="undecided"):
        parse_run_json(json.dumps(run, allow_nan=False))


def test_the_allure_result_of_an_undecided_comparison_is_unknown(tmp_path: Path) -> None:
    outcome = _outcome(tmp_path, _decision(AbVerdict.UNKNOWN))
    path = write_allure_result(outcome, tmp_path / "allure-results")
    result = json.loads(path.read_text())
    assert result["status"] == "unknown"
    assert result["statusDetails"]["message"] == (
        "undecided (neither a regression nor its absence shown): decode_tps 0.947 "
        "[0.922, 0.976]")
    assert result["statusDetails"]["trace"].startswith("undecided: decode_tps: ")


# -- harness ab ---------------------------------------------------------------------------

class _Fixtures:
    def __init__(self, folder: Path) -> None:
        self._folder = folder

    def model(self, fixture: str) -> Path:
        return self._folder / f"{fixture}.gguf"


def test_harness_ab_exits_3_when_undecided_and_replaces_an_ab_in_the_run(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    outcomes = [_outcome(tmp_path, _decision(AbVerdict.UNKNOWN)),
                _outcome(tmp_path, _decision(AbVerdict.UNCHANGED,
                                             RatioInterval(1.0, 0.99, 1.01, 0.95, 40)))]
    monkeypatch.setenv(VALIDATION_ENV, str(tmp_path / "no-validation.json"))
    monkeypatch.setattr(ab_command_module, "resolve_arm",
                        lambda name, option: Arm(option.strip("-"), binary=tmp_path / name))
    monkeypatch.setattr(modelgen, "ensure_fixtures",
                        lambda: _Fixtures(tmp_path))
    monkeypatch.setattr(ab_command_module, "run_ab",
                        lambda *_args, **_kwargs: outcomes.pop(0))
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_run("gate-run").to_json()))
    args = ["--baseline", "base", "--candidate", "head", "--metric", "decode_tps",
            "--record", str(run_json)]

    first = CliRunner().invoke(ab_command_module.ab_command, args)
    assert first.exit_code == EXIT_UNDECIDED, first.output
    assert first.stdout.rstrip().splitlines()[-1].startswith("undecided: decode_tps: ")
    assert "replaced" not in first.stderr
    recorded = parse_run_json(run_json.read_bytes()).ab
    assert recorded is not None
    assert recorded["undecided"] == ["decode_tps"]

    # The gate's rerun: the same arguments, the second result over the first, said.
    second = CliRunner().invoke(ab_command_module.ab_command, args)
    assert second.exit_code == EXIT_DECIDED, second.output
    assert f"replaced the A/B result already in {run_json}" in second.stderr
    recorded = parse_run_json(run_json.read_bytes()).ab
    assert recorded is not None
    assert recorded["undecided"] == []
    assert recorded["metrics"]["decode_tps"]["verdict"] == "unchanged"
