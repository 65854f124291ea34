"""The current run's paired A/B result in a comparison: its markdown section, its JSON,
that an A/B regression fails the comparison (and `harness compare`) as a figure does, and
that an undecided A/B heads it as undecided, never as a pass."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from click.testing import CliRunner
from results_fixtures import at, fig, make_run

from harness.commands.compare import EXIT_OK, EXIT_REGRESSED, compare_command
from harness.results.comparison import Comparison, compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.run_record import RunRecord
from harness.results.store import open_store

#: Five baseline decode speeds, roughly N(1000, 10): 1001 now is unchanged.
DECODE = (1000.0, 1012.0, 988.0, 995.0, 1005.0)
LONG_TEXT = "Once upon a time | there was\na model " + "that talked " * 20


def _ab(*, decode_verdict: str = "regressed",
        changes: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """An ``ab`` object shaped as harness/ab/report.py's record_json writes it."""
    return {
        "baseline": "build cpu-0123456789ab", "candidate": "build cpu-feedbeef0000",
        "design": "interleaved", "threshold": 0.03,
        # Not in METRICS order: the section puts them in it.
        "metrics": {
            "ttft_ms": {"verdict": "unknown", "pairs": 2, "ratio": None, "ci_low": None,
                        "ci_high": None},
            "decode_tps": {"verdict": decode_verdict, "pairs": 16, "ratio": 0.90123,
                           "ci_low": 0.8875, "ci_high": 0.915},
            "prompt_tps": {"verdict": "unchanged", "pairs": 12, "ratio": 1.0025,
                           "ci_low": 0.99, "ci_high": 1.0151},
        },
        "counter_changes": changes if changes is not None else [
            {"name": "compute_mib[CPU]", "baseline": "300.01", "candidate": "412.50"},
            {"name": "greedy_text", "baseline": LONG_TEXT, "candidate": "short"}],
    }


def _baseline() -> list[RunRecord]:
    return [make_run(f"base-{i}", started_at=at(len(DECODE) - i),
                     figures=[fig("decode_tps", value)]) for i, value in enumerate(DECODE)]


def _compare(ab: dict[str, Any] | None) -> Comparison:
    current = replace(make_run("current", branch="feature", started_at=at(100),
                               figures=[fig("decode_tps", 1001.0)]), ab=ab)
    return compare(_baseline(), current)


def test_an_ab_regression_fails_the_comparison_and_heads_the_summary() -> None:
    comparison = _compare(_ab())
    assert comparison.regressions == []  # the figures alone are fine
    assert comparison.ab_regressions == ["decode_tps"]
    assert comparison.regressed
    text = comparison_markdown(comparison)
    assert text.startswith("## ❌ Regressed: A/B regression in decode_tps\n")
    assert "### Performance A/B: ❌ regressed (decode_tps)" in text


def test_the_section_has_a_row_per_metric_in_metrics_order() -> None:
    text = comparison_markdown(_compare(_ab()))
    section = text[text.index("### Performance A/B"):]
    assert ("Candidate `build cpu-feedbeef0000` against baseline `build cpu-0123456789ab`, "
            "measured side by side (interleaved design)") in section
    assert "more than 3 % worse" in section
    rows = [line for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| ---")]
    assert rows[:5] == [
        "| Metric | Ratio | 95 % CI | Pairs | Verdict |",
        "| ttft_ms (ms) | — | — | 2 | unknown |",
        "| prompt_tps (tokens/s) | 1.002 | [0.990, 1.015] | 12 | unchanged |",
        "| decode_tps (tokens/s) | 0.901 | [0.887, 0.915] | 16 | **regressed** |",
        "| Counter | Baseline | Candidate |",
    ]


def test_counter_changes_are_listed_with_long_values_cut() -> None:
    text = comparison_markdown(_compare(_ab()))
    assert "Deterministic counters that changed (2):" in text
    assert "| `compute_mib[CPU]` | 300.01 | 412.50 |" in text
    row = next(line for line in text.splitlines() if line.startswith("| `greedy_text`"))
    # One line, its pipe escaped, cut to 80 characters with an ellipsis.
    assert row.startswith("| `greedy_text` | Once upon a time \\| there was a model that")
    assert row.endswith("… | short |")
    assert len(row) < 120


def test_no_counter_change_says_so() -> None:
    text = comparison_markdown(_compare(_ab(changes=[])))
    assert "No deterministic counter changed." in text
    assert "| Counter |" not in text


def test_an_ab_result_without_regression_only_adds_its_section() -> None:
    quiet = _compare(_ab(decode_verdict="improved"))
    assert not quiet.regressed
    assert quiet.ab_regressions == []
    text = comparison_markdown(quiet)
    before = comparison_markdown(_compare(None))
    assert before.startswith("## ✅ No regression")
    # The report as it was, then the section.
    assert text.startswith(before)
    assert text[len(before):].startswith("\n### Performance A/B\n")
    assert "| decode_tps (tokens/s) | 0.901 | [0.887, 0.915] | 16 | improved |" in text


def test_without_an_ab_result_there_is_no_section_and_json_ab_is_null() -> None:
    comparison = _compare(None)
    assert comparison.ab is None
    assert "A/B" not in comparison_markdown(comparison)
    body = comparison_json(comparison)
    assert body["ab"] is None
    assert body["regressed"] is False


def test_json_carries_the_ab_object_and_its_verdict() -> None:
    body = json.loads(json.dumps(comparison_json(_compare(_ab())), allow_nan=False))
    assert body["ab"] == _ab()
    assert body["regressed"] is True
    assert body["verdict"] == "regressed"
    assert body["ab"]["metrics"]["decode_tps"]["ci_high"] == 0.915


def test_harness_compare_exits_1_on_a_stored_runs_ab_regression(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(url) as store:
        for run in _baseline():
            store.add_run(run)
        store.add_run(replace(make_run("pr-ab", branch="feature", started_at=at(50),
                                       figures=[fig("decode_tps", 1001.0)]), ab=_ab()))
        store.add_run(replace(make_run("pr-quiet", branch="feature", started_at=at(60),
                                       figures=[fig("decode_tps", 1001.0)]),
                              ab=_ab(decode_verdict="unchanged")))

    def harness_compare(*args: str) -> tuple[int, str]:
        result = CliRunner().invoke(compare_command, [*args, "--results-url", url],
                                    catch_exceptions=False)
        return result.exit_code, result.stdout

    code, text = harness_compare("--baseline", "main", "--current", "pr-ab")
    assert code == EXIT_REGRESSED, text
    assert "### Performance A/B: ❌ regressed (decode_tps)" in text
    code, text = harness_compare("--baseline", "main", "--current", "pr-ab", "--format", "json")
    assert code == EXIT_REGRESSED
    assert json.loads(text)["ab"] == _ab()
    code, text = harness_compare("--baseline", "main", "--current", "pr-quiet")
    assert code == EXIT_OK, text
    assert "### Performance A/B\n" in text


#: What harness/ab/undecided.py says of the issue's comparison.
WOULD_DECIDE = ("it straddles the band's lower edge 0.970: about 28 more pairs (≈ 72 s at "
                "this rate) would clear it")


def _undecided_ab() -> dict[str, Any]:
    """An A/B result that regressed nothing and left decode_tps undecided."""
    ab = _ab(decode_verdict="unknown", changes=[])
    ab["metrics"]["decode_tps"].update(ratio=0.947, ci_low=0.922, ci_high=0.976,
                                       would_decide=WOULD_DECIDE)
    ab["undecided"] = ["decode_tps", "ttft_ms"]
    return ab


def test_an_undecided_ab_heads_the_summary_as_undecided_not_as_a_pass() -> None:
    comparison = _compare(_undecided_ab())
    assert not comparison.regressed  # undecided is not a regression: compare exits 0
    assert comparison.ab_undecided == ["ttft_ms", "decode_tps"]  # in METRICS order
    text = comparison_markdown(comparison)
    assert text.startswith("## ⚠️ Undecided: the A/B left ttft_ms, decode_tps undecided "
                           "(no regression found, none ruled out)\n")
    assert "✅" not in text
    assert "### Performance A/B: ⚠️ undecided (ttft_ms, decode_tps)" in text
    assert "| decode_tps (tokens/s) | 0.947 | [0.922, 0.976] | 16 | ⚠️ **undecided** |" in text
    assert "| prompt_tps (tokens/s) | 1.002 | [0.990, 1.015] | 12 | unchanged |" in text
    assert f"- decode_tps: {WOULD_DECIDE}" in text
    assert "- ttft_ms: —" in text  # the record says nothing for it
    body = json.loads(json.dumps(comparison_json(comparison), allow_nan=False))
    assert (body["regressed"], body["verdict"]) == (False, "undecided")
    assert body["ab_undecided"] == ["ttft_ms", "decode_tps"]


def test_a_record_without_the_undecided_list_is_not_called_undecided() -> None:
    # Written before the state existed: its unknowns cannot tell undecided from settled.
    comparison = _compare(_ab(decode_verdict="unknown"))
    assert comparison.ab_undecided == []
    assert comparison_markdown(comparison).startswith("## ✅ No regression")
    assert comparison_json(comparison)["verdict"] == "ok"


def test_a_regressed_ab_is_regressed_not_undecided() -> None:
    ab = {**_ab(), "undecided": ["ttft_ms"]}
    comparison = _compare(ab)
    assert comparison.ab_undecided == []
    text = comparison_markdown(comparison)
    assert text.startswith("## ❌ Regressed: A/B regression in decode_tps")
    assert "### Performance A/B: ❌ regressed (decode_tps)\n" in text
    assert "⚠️" not in text
    assert comparison_json(comparison)["verdict"] == "regressed"


def test_harness_compare_shows_a_stored_undecided_ab_and_exits_0(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(url) as store:
        for run in _baseline():
            store.add_run(run)
        store.add_run(replace(make_run("pr-undecided", branch="feature", started_at=at(50),
                                       figures=[fig("decode_tps", 1001.0)]),
                              ab=_undecided_ab()))
    result = CliRunner().invoke(compare_command, ["--baseline", "main", "--current",
                                                  "pr-undecided", "--results-url", url],
                                catch_exceptions=False)
    assert result.exit_code == EXIT_OK, result.stdout
    assert result.stdout.startswith("## ⚠️ Undecided: the A/B left ttft_ms, decode_tps")
    # The list and the sentence came back from the store.
    assert f"- decode_tps: {WOULD_DECIDE}" in result.stdout
