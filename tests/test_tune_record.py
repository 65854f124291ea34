"""A tune kept with its run: ``harness tune --record`` adds it to run.json through the
schema; ``harness compare`` reports a stale card and the dashboard lists it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from results_fixtures import at, fig, make_run

from harness.errors import HarnessError
from harness.results.comparison import compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.run_validation import add_to_run, parse_run_json
from harness.service.dashboard import tune_notes
from harness.service.dashboard_page import render_page
from harness.service.dashboard_view import SeriesFilter, build_model, select_page

FIGURE: dict[str, object] = {"metric": "prompt_tps", "verdict": "improved", "ratio": 3.8,
                              "low": 2.9, "high": 4.4, "pairs": 6}
WINNER: dict[str, object] = {"name": "ubatch 256", "differs": ["ubatch_size 4 -> 256"],
                              "figures": [FIGURE]}
STALE: dict[str, object] = {
    "card": "rtx-4090", "key": "model:llama", "context": "2048", "build_key": "cpu-1",
    "check": True, "threshold": 0.05, "stale": True,
    "current": ["batch_size 4", "ubatch_size 4"],
    "winner": WINNER,
    "candidates": [{"name": "ubatch 256", "differs": ["ubatch_size 4 -> 256"],
                    "verdict": "better", "figures": [FIGURE]},
                   {"name": "kv q4_0", "differs": ["cache_type_k f16 -> q4_0"],
                    "verdict": "pruned: the build lacks it", "figures": []}],
    "summary": "ubatch 256 beats the current plan",
}
HOLDS = {**STALE, "stale": False, "winner": None,
         "summary": "the current plan holds: none of the 2 candidates measured was faster"}


def test_a_tune_is_added_to_a_run_record_through_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(make_run("night-1").to_json()))
    add_to_run(path, "tune", STALE, what="the tune")
    assert parse_run_json(path.read_bytes()).tune == STALE
    before = path.read_bytes()
    for bad in ({**STALE, "stale": "yes"}, {**STALE, "threshold": float("nan")},
                {**STALE, "winner": {**WINNER, "figures": [{**FIGURE, "metric": "x"}]}},
                {**STALE, "extra": 1}):
        with pytest.raises(HarnessError, match="with the tune"):
            add_to_run(path, "tune", bad, what="the tune")
    assert path.read_bytes() == before


def test_compare_reports_a_stale_card_as_a_warning_and_a_card_that_holds() -> None:
    baseline = [make_run(f"b{i}", started_at=at(i), figures=[fig("decode_tps", 100.0)])
                for i in range(3)]
    current = replace(make_run("now", started_at=at(9), figures=[fig("decode_tps", 100.0)]),
                      tune=STALE)
    c = compare(baseline, current)
    text = comparison_markdown(c)
    assert "### Stale card" in text
    assert "A warning, not a failure: `ubatch 256` beat the card's plan" in text
    assert "| prompt_tps | 3.800 | 2.900-4.400 | improved | 6 |" in text
    assert comparison_json(c)["tune"] == STALE
    assert not c.regressed  # a stale card warns; it fails nothing
    holds = comparison_markdown(compare(baseline, replace(current, tune=HOLDS)))
    assert "### Tune" in holds
    assert "The card's plan holds" in holds


def test_the_dashboard_lists_stale_cards_beside_their_runs() -> None:
    runs = [replace(make_run("now", started_at=at(9), figures=[fig("decode_tps", 80.0)]),
                    tune=STALE),
            replace(make_run("before", started_at=at(1), figures=[fig("decode_tps", 100.0)]),
                    tune=HOLDS)]
    notes = tune_notes(runs)
    assert [(n.run_id, n.stale) for n in notes] == [("now", True), ("before", False)]
    assert notes[0].finding == ("stale: ubatch 256 (ubatch_size 4 -> 256) beat the plan for "
                                "model:llama at context 2048: prompt_tps x3.800 "
                                "[2.900, 4.400]")
    model = build_model("main", runs[0].hardware.identity, 60, "v", runs)
    page = render_page(model, select_page(model, SeriesFilter(), 1), SeriesFilter())
    assert '<section id="tunes"><h2>Card tunes</h2>' in page
    assert "<strong>stale card</strong> (a warning): stale: ubatch 256" in page
    assert "the plan for model:llama at context 2048 holds" in page
