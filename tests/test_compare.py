"""Comparison of a run with its baseline: test outcome changes, the noise rule on
figures, hardware refusal, rendering, and choosing the baseline from the store."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import pytest
import results_fixtures
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, figure_key, make_run, outcome

from harness.errors import ConfigError, HarnessError
from harness.results.baseline_selection import select_baseline
from harness.results.comparison import Comparison, FigureResult, HardwareMismatchError, compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.noise_rule import NoiseRule, judge
from harness.results.rules import FigureStatus
from harness.results.run_record import METRICS, Direction, Figure, FigureKey, Hardware, RunRecord
from harness.results.store import ResultsStore

# Shared fixtures (tests/ has no conftest.py): each store test runs on SQLite and PostgreSQL.
store_url = results_fixtures.store_url
store = results_fixtures.store

#: Five baseline decode speeds, roughly N(1000, 10).
DECODE = (1000.0, 1012.0, 988.0, 995.0, 1005.0)


def _baseline(metric: str, values: Sequence[float], *, key: FigureKey = results_fixtures.KEY,
              hardware: Hardware = CPU_BOX) -> list[RunRecord]:
    """One run per value, newest (the anchor) first."""
    return [make_run(f"base-{i}", started_at=at(len(values) - i), hardware=hardware,
                     figures=[fig(metric, value, key=key)])
            for i, value in enumerate(values)]


def _current(*figures: Figure, hardware: Hardware = CPU_BOX) -> RunRecord:
    return make_run("current", branch="feature", started_at=at(100), hardware=hardware,
                    figures=figures)


def _only(comparison: Comparison) -> FigureResult:
    assert len(comparison.figure_results) == 1, comparison.figure_results
    return comparison.figure_results[0]


# -- tests -----------------------------------------------------------------------

def test_test_outcome_categories() -> None:
    anchor = make_run("anchor", outcomes=[
        outcome("a"), outcome("b", "failed"), outcome("c"), outcome("d", "skipped"),
        outcome("e", "failed"), outcome("g"), outcome("h", "error")])
    current = make_run("current", outcomes=[
        outcome("a", "failed", message="boom"), outcome("b"), outcome("c"),
        outcome("d", "error"), outcome("e", "error"), outcome("f"), outcome("h", "skipped")])
    result = compare([anchor], current)
    assert [(t.test_id, t.before, t.after) for t in result.newly_failing] == [
        ("a", "passed", "failed"), ("d", "skipped", "error")]
    assert result.newly_failing[0].message == "boom"
    assert [(t.test_id, t.before, t.after) for t in result.fixed] == [
        ("b", "failed", "passed"), ("h", "error", "skipped")]
    assert [t.test_id for t in result.still_failing] == ["e"]
    assert [(t.test_id, t.after) for t in result.new_tests] == [("f", "passed")]
    assert [(t.test_id, t.before) for t in result.removed_tests] == [("g", "passed")]
    assert result.regressed


def test_fixes_and_new_failing_tests_alone_are_not_a_regression() -> None:
    anchor = make_run("anchor", outcomes=[outcome("a", "failed")])
    current = make_run("current", outcomes=[outcome("a"), outcome("brand-new", "failed")])
    result = compare([anchor], current)
    assert [t.test_id for t in result.fixed] == ["a"]
    assert [t.test_id for t in result.new_tests] == ["brand-new"]
    assert not result.regressed


def test_tests_compare_with_the_anchor_only() -> None:
    anchor = make_run("anchor", started_at=at(2), outcomes=[outcome("a")])
    older = make_run("older", started_at=at(1),
                     outcomes=[outcome("a", "failed"), outcome("z")])
    current = make_run("current", outcomes=[outcome("a", "failed"), outcome("z")])
    result = compare([anchor, older], current)
    assert [t.test_id for t in result.newly_failing] == ["a"]
    assert [t.test_id for t in result.new_tests] == ["z"]


def test_a_rerun_test_counts_by_its_last_report() -> None:
    anchor = make_run("anchor", outcomes=[outcome("a")])
    current = make_run("current", outcomes=[outcome("a", "failed"), outcome("a")])
    assert not compare([anchor], current).regressed


# -- figures -------------------------------------------------------------------------

def test_a_real_slowdown_is_a_regression() -> None:
    result = compare(_baseline("decode_tps", DECODE), _current(fig("decode_tps", 850.0)))
    figure = _only(result)
    assert figure.status == FigureStatus.REGRESSED
    assert result.regressed
    assert figure.judgement.n == 5
    assert figure.judgement.mean == pytest.approx(1000.0)
    assert figure.judgement.change == pytest.approx(-0.15)
    assert figure.unit == "tokens/s"


def test_noise_is_not_flagged() -> None:
    result = compare(_baseline("decode_tps", DECODE), _current(fig("decode_tps", 990.0)))
    assert _only(result).status == FigureStatus.UNCHANGED
    assert not result.regressed


def test_a_speedup_is_an_improvement_not_a_regression() -> None:
    result = compare(_baseline("decode_tps", DECODE), _current(fig("decode_tps", 1150.0)))
    assert _only(result).status == FigureStatus.IMPROVED
    assert not result.regressed


def test_lower_is_better_metrics_regress_upwards() -> None:
    ttft = (100.0, 102.0, 98.0, 101.0, 99.0)
    slower = compare(_baseline("ttft_ms", ttft), _current(fig("ttft_ms", 130.0)))
    faster = compare(_baseline("ttft_ms", ttft), _current(fig("ttft_ms", 70.0)))
    assert (_only(slower).status, slower.regressed) == (FigureStatus.REGRESSED, True)
    assert (_only(faster).status, faster.regressed) == (FigureStatus.IMPROVED, False)


def test_fewer_than_min_runs_is_never_judged() -> None:
    result = compare(_baseline("decode_tps", DECODE[:2]), _current(fig("decode_tps", 100.0)))
    assert _only(result).status == FigureStatus.NO_BASELINE
    assert not result.regressed
    # The rule's min_runs decides, not a constant.
    relaxed = compare(_baseline("decode_tps", DECODE[:2]), _current(fig("decode_tps", 100.0)),
                      NoiseRule(min_runs=2))
    assert _only(relaxed).status == FigureStatus.REGRESSED


def test_only_baseline_runs_with_the_figure_count() -> None:
    runs = _baseline("decode_tps", DECODE[:2])
    runs.append(make_run("no-figures", started_at=at(0)))
    result = compare(runs, _current(fig("decode_tps", 100.0)))
    assert _only(result).status == FigureStatus.NO_BASELINE
    assert _only(result).judgement.n == 2


def test_a_run_counts_by_the_median_of_its_samples() -> None:
    # One outlier sample in the current run must not drag its value down (a mean would).
    current = _current(fig("decode_tps", 1000.0), fig("decode_tps", 1001.0),
                       fig("decode_tps", 10.0))
    result = compare(_baseline("decode_tps", DECODE), current)
    assert _only(result).current == 1000.0
    assert _only(result).status == FigureStatus.UNCHANGED


def test_different_keys_are_never_compared_with_each_other() -> None:
    long_prompt = figure_key(n_prompt=512)
    other_gen = figure_key(n_gen=64)
    flash = figure_key(flash_attn="on")
    baseline = [make_run(f"b{i}", started_at=at(10 - i), figures=[
        fig("decode_tps", value), fig("decode_tps", value / 2, key=long_prompt),
        fig("decode_tps", value / 4, key=other_gen)]) for i, value in enumerate(DECODE)]
    current = _current(fig("decode_tps", 500.0, key=long_prompt),
                       fig("decode_tps", 250.0, key=other_gen),
                       fig("decode_tps", 10.0, key=flash))
    result = compare(baseline, current)
    by_key = {(r.key, r.metric): r.status for r in result.figure_results}
    assert by_key == {
        (long_prompt, "decode_tps"): FigureStatus.UNCHANGED,
        (other_gen, "decode_tps"): FigureStatus.UNCHANGED,
        (flash, "decode_tps"): FigureStatus.NO_BASELINE,
        (results_fixtures.KEY, "decode_tps"): FigureStatus.MISSING_NOW,
    }
    assert not result.regressed


def test_metrics_of_one_key_are_separate_figures() -> None:
    baseline = [make_run(f"b{i}", started_at=at(10 - i), figures=[
        fig("decode_tps", v), fig("prompt_tps", v * 3)]) for i, v in enumerate(DECODE)]
    # Same number, other metric: decode at prompt speed would look like a big speedup.
    result = compare(baseline, _current(fig("decode_tps", 1000.0), fig("prompt_tps", 3000.0)))
    assert [r.status for r in result.figure_results] == [FigureStatus.UNCHANGED] * 2


def test_a_figure_gone_from_the_current_run_is_informational() -> None:
    result = compare(_baseline("kv_mib", (64.0, 64.0, 64.0)), _current())
    assert _only(result).status == FigureStatus.MISSING_NOW
    assert _only(result).current is None
    assert not result.regressed


def test_unknown_metric_says_where_to_define_it() -> None:
    with pytest.raises(HarnessError, match="METRICS"):
        compare(_baseline("bogus", DECODE), _current(fig("bogus", 1.0)))


# -- the rule itself -------------------------------------------------------------------

def test_judge_needs_both_a_big_change_and_a_big_z() -> None:
    up = Direction.HIGHER_IS_BETTER
    noisy = (1000.0, 1300.0, 700.0, 1200.0, 800.0)
    assert judge(noisy, 850.0, up).status == FigureStatus.UNCHANGED  # -15 % but z < 1
    steady = (1000.0, 1000.1, 999.9, 1000.05, 999.95)
    assert judge(steady, 990.0, up).status == FigureStatus.UNCHANGED  # z huge but only -1 %
    assert judge(steady, 940.0, up).status == FigureStatus.REGRESSED
    assert judge(steady, 940.0, up, NoiseRule(threshold=0.1)).status == FigureStatus.UNCHANGED


def test_judge_on_a_flat_baseline() -> None:
    flat = (1000.0, 1000.0, 1000.0)
    same = judge(flat, 1000.0, Direction.HIGHER_IS_BETTER)
    assert (same.status, same.z) == (FigureStatus.UNCHANGED, 0.0)
    worse = judge(flat, 900.0, Direction.HIGHER_IS_BETTER)
    assert worse.status == FigureStatus.REGRESSED
    assert worse.z == math.inf


def test_judge_reports_its_numbers() -> None:
    j = judge(DECODE, 850.0, Direction.HIGHER_IS_BETTER)
    assert j.n == 5
    # Sample stdev (n - 1): squared deviations 0 + 144 + 144 + 25 + 25 over 4.
    assert j.stdev == pytest.approx(math.sqrt(338 / 4))
    assert j.z == pytest.approx(150.0 / math.sqrt(338 / 4))
    assert judge(DECODE[:1], 850.0, Direction.HIGHER_IS_BETTER).status == FigureStatus.NO_BASELINE


@pytest.mark.parametrize("bad", [{"threshold": -0.1}, {"z": -1.0}, {"min_runs": 1},
                                 {"threshold": math.nan}])
def test_nonsense_rules_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError):
        NoiseRule(**bad)  # type: ignore[arg-type]


# -- hardware ---------------------------------------------------------------------------

def test_other_hardware_is_refused_with_both_descriptions() -> None:
    with pytest.raises(HardwareMismatchError) as caught:
        compare(_baseline("decode_tps", DECODE, hardware=GPU_BOX),
                _current(fig("decode_tps", 1000.0)))
    message = str(caught.value)
    assert GPU_BOX.describe() in message
    assert CPU_BOX.describe() in message


def test_any_baseline_run_on_other_hardware_is_refused() -> None:
    runs = _baseline("decode_tps", DECODE)
    runs[3] = make_run("intruder", hardware=GPU_BOX)
    with pytest.raises(HardwareMismatchError, match="intruder"):
        compare(runs, _current(fig("decode_tps", 1000.0)))


def test_the_host_name_is_not_part_of_the_hardware() -> None:
    twin = Hardware(host="ci-2", cpu=CPU_BOX.cpu)
    result = compare(_baseline("decode_tps", DECODE, hardware=twin),
                     _current(fig("decode_tps", 1000.0)))
    assert _only(result).status == FigureStatus.UNCHANGED


def test_an_empty_baseline_is_an_error() -> None:
    with pytest.raises(HarnessError, match="no baseline runs"):
        compare([], _current())


# -- rendering --------------------------------------------------------------------------

def _mixed() -> Comparison:
    baseline = _baseline("decode_tps", DECODE)
    anchor = baseline[0]
    baseline[0] = make_run(anchor.run_id, started_at=anchor.started_at,
                           figures=anchor.figures,
                           outcomes=[outcome("t::ok"), outcome("t::pipe")])
    current = make_run("current", started_at=at(100), outcomes=[
        outcome("t::ok"), outcome("t::pipe", "failed", message="a | b\nnext line")],
        figures=[fig("decode_tps", 850.0), fig("ttft_ms", 5.0)])
    return compare(baseline, current)


def test_markdown_summary() -> None:
    text = comparison_markdown(_mixed())
    assert text.startswith("## ❌ Regressed: 1 newly failing test, 1 figure regression")
    assert "`current`" in text
    assert "`base-0`" in text
    assert "`base-4`" in text
    assert CPU_BOX.describe() in text
    assert "### Newly failing tests (1)" in text
    assert "a \\| b next line" in text  # a pipe cannot break the table
    assert "### Figure regressions (1)" in text
    assert "-15.0 %" in text
    assert "1 without a baseline" in text


def test_markdown_when_all_is_well() -> None:
    text = compare(_baseline("decode_tps", DECODE), _current(fig("decode_tps", 1001.0)))
    assert comparison_markdown(text).startswith("## ✅ No regression")
    assert "1 unchanged" in comparison_markdown(text)


def test_json_is_serialisable_with_stable_keys() -> None:
    flat = compare(_baseline("decode_tps", (1000.0, 1000.0, 1000.0)),
                   _current(fig("decode_tps", 900.0)))
    body = json.loads(json.dumps(comparison_json(flat), allow_nan=False))
    assert body["regressed"] is True
    assert body["figures"][0]["z"] == "inf"
    body = json.loads(json.dumps(comparison_json(_mixed()), allow_nan=False))
    assert set(body) == {"regressed", "verdict", "current_run", "baseline_runs", "hardware",
                         "rule", "tests", "figures", "figure_counts", "ab", "ab_undecided",
                         "bisect", "tune", "numerics", "numerics_counts", "drift"}
    assert body["ab"] is None  # no A/B result in the current run
    assert body["bisect"] is None
    assert body["tune"] is None
    assert body["drift"] == []  # no card configs given
    assert set(body["tests"]) == {"newly_failing", "fixed", "still_failing", "new_tests",
                                  "removed_tests"}
    assert body["tests"]["newly_failing"][0]["test_id"] == "t::pipe"
    decode = next(f for f in body["figures"] if f["metric"] == "decode_tps")
    assert decode["status"] == FigureStatus.REGRESSED
    assert decode["change_percent"] == pytest.approx(-15.0)
    assert decode["key"]["n_prompt"] == 128
    assert body["figure_counts"][FigureStatus.NO_BASELINE] == 1
    # Every status is counted, zeros too, in the enum's order.
    assert list(body["figure_counts"]) == [status.value for status in FigureStatus]
    assert {f["status"] for f in body["figures"]} <= {status.value for status in FigureStatus}
    assert body["hardware"]["identity"] == CPU_BOX.identity


# -- choosing the baseline ------------------------------------------------------------

@pytest.fixture
def history(store: ResultsStore) -> ResultsStore:
    """m1..m6 on main, f0 on feature (oldest), g8 on a GPU box; c9 on feature is newest."""
    for minute in range(1, 7):
        store.add_run(make_run(f"m{minute}", started_at=at(minute)))
    store.add_run(make_run("f0", branch="feature", started_at=at(0)))
    store.add_run(make_run("g8", started_at=at(8), hardware=GPU_BOX))
    store.add_run(make_run("gpu-branch-run", branch="gpu-only", started_at=at(8),
                           hardware=GPU_BOX))
    store.add_run(make_run("c9", branch="feature", started_at=at(9)))
    return store


def _ids(runs: Sequence[RunRecord]) -> list[str]:
    return [run.run_id for run in runs]


def _stored(store: ResultsStore, run_id: str) -> RunRecord:
    run = store.get_run(run_id)
    assert run is not None
    return run


def test_latest_is_the_newest_earlier_run_on_this_hardware(history: ResultsStore) -> None:
    current = _stored(history, "c9")
    assert _ids(select_baseline(history, "latest", current)) == ["m6", "m5", "m4", "m3", "m2"]
    assert _ids(select_baseline(history, "latest", current, window=2)) == ["m6", "m5"]


def test_a_run_id_anchors_the_baseline(history: ResultsStore) -> None:
    current = _stored(history, "c9")
    assert _ids(select_baseline(history, "m3", current)) == ["m3", "m2", "m1"]


def test_a_branch_anchors_at_its_newest_run_here(history: ResultsStore) -> None:
    current = _stored(history, "c9")
    assert _ids(select_baseline(history, "main", current)) == ["m6", "m5", "m4", "m3", "m2"]
    # The current run's own branch: its newest other run.
    assert _ids(select_baseline(history, "feature", current)) == ["f0"]


def test_the_current_run_is_never_its_own_baseline(history: ResultsStore) -> None:
    current = _stored(history, "m4")
    assert _ids(select_baseline(history, "m6", current)) == ["m6", "m5", "m3", "m2", "m1"]
    with pytest.raises(HarnessError, match="is the run being compared"):
        select_baseline(history, "m4", current)


def test_latest_for_a_run_that_is_not_stored(history: ResultsStore) -> None:
    unsaved = make_run("unsaved", started_at=at(50))
    assert _ids(select_baseline(history, "latest", unsaved, window=1)) == ["c9"]


def test_latest_with_nothing_earlier_says_so(history: ResultsStore) -> None:
    with pytest.raises(HarnessError, match="no run older than f0"):
        select_baseline(history, "latest", _stored(history, "f0"))


def test_unknown_selector_lists_what_exists(history: ResultsStore) -> None:
    with pytest.raises(HarnessError) as caught:
        select_baseline(history, "no-such-thing", _stored(history, "c9"))
    message = str(caught.value)
    assert "'no-such-thing'" in message
    assert "main" in message
    assert "feature" in message
    assert "c9" in message


def test_unknown_selector_in_an_empty_store(store: ResultsStore) -> None:
    with pytest.raises(HarnessError, match="holds no runs"):
        select_baseline(store, "main", make_run("x"))


def test_a_baseline_on_other_hardware_is_refused(history: ResultsStore) -> None:
    current = _stored(history, "c9")
    with pytest.raises(HardwareMismatchError) as caught:
        select_baseline(history, "g8", current)
    assert GPU_BOX.describe() in str(caught.value)
    assert CPU_BOX.describe() in str(caught.value)
    with pytest.raises(HardwareMismatchError):
        select_baseline(history, "gpu-only", current)


def test_a_move_below_the_metrics_absolute_floor_never_counts() -> None:
    # A quiet 3 ms first token moving to 4.5 ms: +50 % and far beyond 3 stdevs, but
    # under the 5 ms floor of ttft_ms, so it is the clock's grain, not a regression.
    quiet = [3.0, 3.01, 2.99, 3.0, 3.02]
    assert judge(quiet, 4.5, Direction.LOWER_IS_BETTER).status == FigureStatus.REGRESSED
    floor = METRICS["ttft_ms"].min_change
    lower = Direction.LOWER_IS_BETTER
    assert judge(quiet, 4.5, lower, NoiseRule(), floor).status == FigureStatus.UNCHANGED
    assert judge(quiet, 9.0, lower, NoiseRule(), floor).status == FigureStatus.REGRESSED


def test_compare_applies_each_metrics_floor() -> None:
    base = [make_run(f"b{i}", started_at=at(i), figures=(fig("ttft_ms", 3.0 + i * 0.01),))
            for i in range(5)]
    current = make_run("cur", started_at=at(9), figures=(fig("ttft_ms", 4.5),))
    result = compare(list(reversed(base)), current)
    assert not result.regressed
    assert [r.status for r in result.figure_results] == [FigureStatus.UNCHANGED]
