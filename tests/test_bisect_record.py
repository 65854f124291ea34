"""A bisect kept with the run whose regression it explains: ``harness bisect --record``
adds it to run.json through the schema; ``harness compare`` and the dashboard show it."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from results_fixtures import at, fig, make_run

from harness.bisect.bisect_allure import write_allure_result
from harness.bisect.bisector import BisectResult
from harness.bisect.history import Commit
from harness.bisect.journal import Probe
from harness.bisect.search import Verdict, window
from harness.errors import HarnessError
from harness.results.comparison import compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.run_validation import (
    RunRecordError,
    add_to_run,
    parse_run_json,
    with_bisect,
)
from harness.service.dashboard import bisect_notes
from harness.service.dashboard_page import render_page
from harness.service.dashboard_view import SeriesFilter, build_model, select_page

CULPRIT = {"sha": "c" * 40, "subject": "server: a wait after each token"}
BISECT = {
    "good": "a" * 40, "bad": "b" * 40, "commits": 8, "reproduced": True,
    "oracle": "metric: decode_tps on bench, threshold 0.03, sequential design, budget 180 s",
    "first_bad": CULPRIT, "candidates": [CULPRIT], "stopped": None,
    "probes": [{"commit": "c" * 40, "subject": CULPRIT["subject"], "verdict": "bad",
                "evidence": "decode_tps 0.880 [0.870, 0.890] vs good: regressed, 8 pairs",
                "build_key": "cpu-1", "build_s": 24.0, "judge_s": 11.0, "cache_hit": False}],
}


def test_a_bisect_is_added_to_a_run_record_through_its_schema(tmp_path: Path) -> None:
    path = tmp_path / "run.json"
    path.write_text(json.dumps(make_run("night-1").to_json()))
    add_to_run(path, "bisect", BISECT, what="its bisect")
    assert parse_run_json(path.read_bytes()).bisect == BISECT
    before = path.read_bytes()
    with pytest.raises(HarnessError, match="with its bisect"):
        add_to_run(path, "bisect", {**BISECT, "good": "not a commit"}, what="its bisect")
    assert path.read_bytes() == before  # refused, and the run left as it was


def test_compare_reports_the_bisect_of_the_run_it_judges() -> None:
    baseline = [make_run(f"b{i}", started_at=at(i), figures=[fig("decode_tps", 100.0)])
                for i in range(3)]
    current = replace(make_run("now", started_at=at(9), figures=[fig("decode_tps", 80.0)]),
                      bisect=BISECT)
    c = compare(baseline, current)
    text = comparison_markdown(c)
    assert "### Bisect" in text
    assert f"first bad commit `{'c' * 40}` server: a wait after each token" in text
    assert comparison_json(c)["bisect"] == BISECT


def test_the_dashboard_shows_a_bisect_beside_its_run() -> None:
    runs = [replace(make_run("now", started_at=at(9), figures=[fig("decode_tps", 80.0)]),
                    bisect=BISECT),
            make_run("before", started_at=at(1), figures=[fig("decode_tps", 100.0)])]
    unreproduced = replace(make_run("other"), bisect={**BISECT, "reproduced": False,
                                                      "first_bad": None})
    assert [n.finding for n in bisect_notes([*runs, unreproduced])] == [
        f"first bad commit {'c' * 40} server: a wait after each token",
        "not reproduced: the endpoints judged alike"]
    model = build_model("main", runs[0].hardware.identity, 60, "v", runs)
    page = render_page(model, select_page(model, SeriesFilter(), 1), SeriesFilter())
    assert '<section id="bisects"><h2>Bisects</h2>' in page
    assert f"first bad commit {'c' * 40} server: a wait after each token" in page
    assert "<code>now</code>" in page


def bisect_result(*, ratios: bool) -> BisectResult:
    history = tuple(Commit(c * 40, f"commit {c}") for c in "abcd")
    verdicts = [Verdict.GOOD, Verdict.SKIP, Verdict.BAD, Verdict.BAD]
    probes = tuple(
        Probe(commit=c.sha, subject=c.subject, verdict=v, evidence="e", build_key="k",
              build_s=1.0, judge_s=1.0, cache_hit=False,
              ratio=(0.9, 0.88, 0.92) if ratios and v is Verdict.BAD else None)
        for c, v in zip(history, verdicts, strict=True))
    shas = [c.sha for c in history]
    return BisectResult(history, probes, window(shas, {p.commit: p.verdict for p in probes}),
                        oracle="metric: decode_tps")


@pytest.mark.parametrize("ratios", [True, False])
def test_a_bisect_is_one_allure_result_with_its_plot(tmp_path: Path, ratios: bool) -> None:
    result = bisect_result(ratios=ratios)
    assert result.window is not None
    assert result.window.candidates == (1, 2)  # the skipped commit or the bad one
    path = write_allure_result(result, tmp_path, seconds=12.0)
    body = json.loads(path.read_text())
    assert body["status"] == "broken"  # no single first bad commit
    assert "the first bad commit is one of 2" in body["statusDetails"]["message"]
    plot = next(a for a in body["attachments"] if a["type"] == "image/png")
    assert (tmp_path / plot["source"]).read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    table = next(a for a in body["attachments"] if a["type"] == "text/markdown")
    assert "| cccccccccccc | commit c | bad |" in (tmp_path / table["source"]).read_text()


@pytest.mark.parametrize("tail", [
    ', "branch": "other"', ', "ab": {"baseline": "x"}', '}, "x": {"y": 1',
    ', "run_id": "another"', ', "bisect": {}'])
def test_a_bisect_cannot_reach_another_field_of_the_run(tail: str) -> None:
    run = make_run("stored")
    assert with_bisect(run, json.dumps(BISECT).encode(), source="put").bisect == BISECT
    with pytest.raises(RunRecordError):
        with_bisect(run, (json.dumps(BISECT)[:-1] + tail + "}").encode(), source="put")
    with pytest.raises(RunRecordError, match="UTF-8"):
        with_bisect(run, b"\xff\xfe", source="put")
