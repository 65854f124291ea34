"""The performance dashboard: its series (pure), and the page as Chromium draws it.

Seven nightly runs are stored with a decode speed that holds, then drops by a third on
the last night; every run carries its prediction and one run an A/B result. The page of
that branch and hardware is opened in headless Chromium from a real service: what the
DOM holds (the drawn points, their links, the regression mark, the prediction line, the
A/B verdict) is counted against the runs stored, and a screenshot is kept.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
from playwright.sync_api import Browser
from results_fixtures import CPU_BOX, at, fig, figure_key, make_run
from service_helpers import no_report
from test_report_browser import NO_CHROMIUM, keep_screenshot, launch_chromium, local_page

from harness.plugin.required import skip_unless_present
from harness.results.rules import FigureStatus
from harness.results.run_record import RunRecord
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.dashboard import dashboard_series, index_rows
from harness.service.dashboard_page import PAGE_CSP, render_page, report_url
from harness.service.settings import ServiceSettings

BRANCH = "nightly/fused-dense/rtx-4090"
DECODE = [100.0, 101.0, 99.0, 100.5, 100.0, 99.5, 66.0]
AB = {"baseline": "pin", "candidate": "head", "design": "duet", "threshold": 0.03,
      "metrics": {"decode_tps": {"verdict": "unchanged", "pairs": 12, "ratio": 1.0,
                                 "ci_low": 0.99, "ci_high": 1.01}},
      "counter_changes": []}


def _nightlies() -> list[RunRecord]:
    runs = []
    for night, value in enumerate(DECODE):
        figures = [replace(fig("decode_tps", value), predicted=110.0),
                   fig("ttft_ms", 20.0 + night % 2),
                   fig("decode_tps", value * 2, key=figure_key(fixture="bench"))]
        run = make_run(f"night-{night}", branch=BRANCH, started_at=at(night),
                       figures=figures)
        runs.append(replace(run, ab=AB) if night == 3 else run)
    return runs


def test_each_series_judges_every_run_against_the_runs_before_it() -> None:
    series = {(s.key.fixture, s.metric.name): s for s in dashboard_series(_nightlies())}
    assert set(series) == {("tiny-llama", "decode_tps"), ("tiny-llama", "ttft_ms"),
                           ("bench", "decode_tps")}
    decode = series[("tiny-llama", "decode_tps")]
    assert [p.value for p in decode.points] == DECODE
    assert [p.status for p in decode.points] == (
        [FigureStatus.NO_BASELINE] * 3 + [FigureStatus.UNCHANGED] * 3
        + [FigureStatus.REGRESSED])
    assert decode.points[0].band is None
    band = decode.points[-1].band
    assert band is not None
    assert band[0] < min(DECODE[:-1]) <= max(DECODE[:-1]) < band[1]
    assert not band[0] <= 66.0 <= band[1]
    assert {p.predicted for p in decode.points} == {110.0}
    assert [p.ab_verdict for p in decode.points].count("unchanged") == 1
    assert series[("tiny-llama", "ttft_ms")].points[-1].ab_verdict is None


def test_the_index_has_one_row_per_branch_and_hardware() -> None:
    runs = [*_nightlies(), make_run("other", branch="main")]
    rows = index_rows(sorted(runs, key=lambda r: r.started_at, reverse=True))
    assert [(r.branch, r.runs) for r in rows] == [(BRANCH, 7), ("main", 1)]


def test_store_text_is_escaped_and_the_page_has_no_script() -> None:
    evil = "<script>alert(1)</script>"
    page = render_page(evil, evil, evil, dashboard_series(_nightlies()))
    assert "<script" not in page
    assert "&lt;script&gt;" in page


@pytest.fixture
def browser() -> Iterator[Browser]:
    skip_unless_present("chromium", NO_CHROMIUM)
    yield from launch_chromium()


def test_chromium_draws_one_point_per_stored_run_each_linking_to_its_report(
        tmp_path: Path, browser: Browser) -> None:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    stored = _nightlies()
    with open_store(url) as store:
        for run in stored:
            assert store.add_run(run)
        assert store.add_run(make_run("elsewhere", branch="main", started_at=at(30)))
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token="t" * 32,
                                     results_url=url, report_generator=no_report))
    query = urlencode({"branch": BRANCH, "hardware": CPU_BOX.identity})
    with serve_in_thread(app) as base:
        answer = httpx.get(f"{base}/dashboard?{query}", timeout=60)
        assert answer.status_code == 200
        assert answer.headers["content-security-policy"] == PAGE_CSP
        page, watch = local_page(browser)
        page.goto(f"{base}/dashboard")
        assert page.locator("table tr").count() == 3  # the header and two pairs
        page.click(f"text={BRANCH}")
        page.wait_for_load_state()
        assert page.url == f"{base}/dashboard?{query}"
        keep_screenshot(page, tmp_path / "dashboard.png", "dashboard screenshot")

        titles = page.locator("h2").all_inner_texts()
        assert len(titles) == 3
        decode = next(i for i, t in enumerate(titles)
                      if t.startswith("decode_tps") and "tiny-llama" in t)
        points = page.locator(f"svg g[id='points-{decode}'] use")
        assert points.count() == len(stored)
        links = page.locator(f"svg g[id='points-{decode}'] a")
        hrefs = [links.nth(i).get_attribute("xlink:href") or links.nth(i).get_attribute("href")
                 for i in range(links.count())]
        assert hrefs == [report_url(run.run_id) for run in stored]
        assert page.locator(f"svg g[id='regressed-{decode}'] use").count() == 1
        assert page.locator(f"svg g[id='improved-{decode}']").count() == 0
        assert page.locator(f"svg g[id='predicted-{decode}'] path").count() >= 1
        assert page.locator(f"svg g[id='band-{decode}']").count() == 1
        svg_text = page.locator("svg").nth(decode).text_content() or ""
        assert re.search(r"A/B unchanged", svg_text)
        for number in range(len(titles)):
            assert page.locator(f"svg g[id='points-{number}'] use").count() == len(stored)
        assert page.locator("script").count() == 0
        assert watch.off_host == []
        page.close()
