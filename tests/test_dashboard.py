"""The performance dashboard: its series (pure), its plots, and the page as Chromium draws it.

Seven nightly runs are stored with a decode speed that holds, then drops by a third on
the last night; every run carries its prediction and one run an A/B result. The page of
that branch and hardware is opened in headless Chromium from a real service: the browser
fetches each plot the page shows, and each plot opened as the page links it is counted
against the runs stored (its points, their links, the regression mark, the prediction
line, the A/B verdict, the last night's bisect); a screenshot is kept. The service side
(paging, filters, caches, the store queries) is tests/test_dashboard_service.py.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx
import pytest
from playwright.sync_api import Browser, Response
from results_fixtures import CPU_BOX, at, fig, figure_key, make_run
from service_helpers import no_report
from test_bisect_record import bisect_result
from test_report_browser import NO_CHROMIUM, keep_screenshot, launch_chromium, local_page

from harness.plugin.required import skip_unless_present
from harness.results.rules import FigureStatus
from harness.results.run_record import RunRecord
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.dashboard import DashboardSeries, dashboard_series, series_id
from harness.service.dashboard_page import PAGE_CSP, PLOT_CSP, render_page
from harness.service.dashboard_svg import report_url, series_svg, svg_key
from harness.service.dashboard_view import SeriesFilter, build_model, select_page
from harness.service.settings import ServiceSettings

BRANCH = "nightly/fused-dense/rtx-4090"
DECODE = [100.0, 101.0, 99.0, 100.5, 100.0, 99.5, 66.0]
AB = {"baseline": "pin", "candidate": "head", "design": "duet", "threshold": 0.03,
      "metrics": {"decode_tps": {"verdict": "unchanged", "pairs": 12, "ratio": 1.0,
                                 "ci_low": 0.99, "ci_high": 1.01}},
      "counter_changes": []}
SVG = "{http://www.w3.org/2000/svg}"


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


def _decode(series: tuple[DashboardSeries, ...]) -> DashboardSeries:
    return next(s for s in series if s.metric.name == "decode_tps"
                and s.key.fixture == "tiny-llama")


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
    assert decode.changed
    assert not series[("tiny-llama", "ttft_ms")].changed


def test_a_series_id_names_its_key_and_metric_the_same_everywhere() -> None:
    decode = _decode(dashboard_series(_nightlies()))
    assert decode.ident == series_id(decode.key, "decode_tps")
    assert len(decode.ident) == 16
    assert int(decode.ident, 16) >= 0
    assert decode.ident != series_id(decode.key, "ttft_ms")
    assert decode.ident != series_id(figure_key(fixture="bench"), "decode_tps")
    # Fixed: a plot's address must survive a restart of the service.
    assert series_id(figure_key(), "decode_tps") == "f6fa2e4b46ab1cea"


def _parsed(svg: str) -> ET.Element:
    return ET.fromstring(svg.encode("utf-8"))


def _group(root: ET.Element, ident: str) -> ET.Element | None:
    return next((g for g in root.iter(f"{SVG}g") if g.get("id") == ident), None)


def test_a_run_that_carries_a_bisect_is_marked_on_its_plots() -> None:
    stored = _nightlies()
    culprit = "1a2b3c4d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b"
    found = {"reproduced": True, "oracle": "metric: decode_tps on bench",
             "first_bad": {"sha": culprit, "subject": "server: a wait after each token"},
             "candidates": [], "probes": []}
    stored[-1] = replace(stored[-1], bisect=found)
    stored[2] = replace(stored[2], bisect={**found, "first_bad": None,
                                           "candidates": [{"sha": "a"}, {"sha": "b"}]})
    decode = _decode(dashboard_series(stored))
    assert [p.bisect for p in decode.points] == [
        None, None, "2 candidates", None, None, None, "first bad 1a2b3c4d5e6f"]
    root = _parsed(series_svg(decode))
    marks = _group(root, "bisect")
    assert marks is not None
    assert len(marks.findall(f"{SVG}line")) == 2
    assert [t.text for t in marks.findall(f"{SVG}text")] == [
        "bisect: 2 candidates", "bisect: first bad 1a2b3c4d5e6f"]
    # The mark is part of what names the plot: a bisect attached later redraws it.
    assert svg_key(decode) != svg_key(_decode(dashboard_series(_nightlies())))
    assert _group(_parsed(series_svg(_decode(dashboard_series(_nightlies())))),
                  "bisect") is None


def test_a_plot_draws_each_run_as_a_point_linking_to_its_report() -> None:
    stored = _nightlies()
    decode = _decode(dashboard_series(stored))
    root = _parsed(series_svg(decode))
    points = _group(root, "points")
    assert points is not None
    links = points.findall(f"{SVG}a")
    assert [a.get("href") for a in links] == [report_url(r.run_id) for r in stored]
    assert all(len(a.findall(f"{SVG}circle")) == 1 for a in links)
    titles = [a.findtext(f"{SVG}title") or "" for a in links]
    assert titles[-1].startswith("2025-01-01 00:06 · commit-of-ni · 66 tokens/s · regressed")
    regressed = _group(root, "regressed")
    assert regressed is not None
    assert len(regressed.findall(f"{SVG}path")) == 1
    assert _group(root, "improved") is None
    band = _group(root, "band")
    assert band is not None
    assert len(band.findall(f"{SVG}polygon")) == 1
    predicted = _group(root, "predicted")
    assert predicted is not None
    assert len(predicted.findall(f"{SVG}polyline")) == 1
    ab = _group(root, "ab")
    assert ab is not None
    assert [t.text for t in ab] == ["A/B unchanged"]
    assert len(root.findall(f"{SVG}polyline")) == 1  # the measured line
    assert root.findtext(f"{SVG}title") == decode.title


def test_an_undecided_ab_is_written_as_undecided_not_as_its_unknown() -> None:
    undecided = {**AB, "metrics": {"decode_tps": {
        "verdict": "unknown", "pairs": 68, "ratio": 0.947, "ci_low": 0.922, "ci_high": 0.976,
        "would_decide": "about 28 more pairs"}}, "undecided": ["decode_tps"]}
    regressed = {**AB, "metrics": {
        "decode_tps": {"verdict": "unknown", "pairs": 8, "ratio": 1.0, "ci_low": 0.9,
                       "ci_high": 1.1},
        "ttft_ms": {"verdict": "regressed", "pairs": 8, "ratio": 1.2, "ci_low": 1.1,
                    "ci_high": 1.3}}, "undecided": []}
    # Written before the state existed: no list, so its unknown stays "unknown".
    old = {**AB, "metrics": {"decode_tps": {"verdict": "unknown", "pairs": 8, "ratio": 1.0,
                                            "ci_low": 0.9, "ci_high": 1.1}}}
    stored = _nightlies()
    for night, result in ((4, undecided), (5, regressed), (6, old)):
        stored[night] = replace(stored[night], ab=result)
    decode = _decode(dashboard_series(stored))
    assert [p.ab_verdict for p in decode.points] == [
        None, None, None, "unchanged", "undecided", "unknown", "unknown"]
    ab = _group(_parsed(series_svg(decode)), "ab")
    assert ab is not None
    texts = list(ab)
    assert [t.text for t in texts] == ["A/B unchanged", "A/B undecided", "A/B unknown",
                                       "A/B unknown"]
    # Orange, where the verdicts take the group's grey: an undecided A/B is no pass.
    assert [t.get("fill") for t in texts] == [None, "#ff7f0e", None, None]


def test_a_plot_is_a_function_of_what_it_draws() -> None:
    decode = _decode(dashboard_series(_nightlies()))
    assert series_svg(decode) == series_svg(decode)
    again = _decode(dashboard_series(_nightlies()))
    assert svg_key(again) == svg_key(decode)
    moved = replace(decode, points=(*decode.points[:-1],
                                    replace(decode.points[-1], value=66.5)))
    assert svg_key(moved) != svg_key(decode)
    assert series_svg(moved) != series_svg(decode)


def test_a_flat_series_and_a_single_run_still_draw() -> None:
    flat = [make_run(f"flat-{i}", started_at=at(i), figures=[fig("kv_mib", 64.0)])
            for i in range(5)]
    for runs in (flat, flat[:1]):
        (series,) = dashboard_series(runs)
        root = _parsed(series_svg(series))
        points = _group(root, "points")
        assert points is not None
        assert len(points.findall(f"{SVG}a")) == len(runs)
        labels = _group(root, "y-labels")
        assert labels is not None
        assert len(labels.findall(f"{SVG}text")) >= 3


def test_store_text_is_escaped_and_neither_page_nor_plot_has_script() -> None:
    evil = "<script>alert(1)</script>\x01\ufffe"
    runs = [replace(run, commit=evil, started_at=run.started_at)
            for run in _nightlies()]
    runs = [replace(run, figures=tuple(replace(f, key=replace(f.key, fixture=evil))
                                       for f in run.figures)) for run in runs]
    model = build_model(evil, evil, 60, "0" * 16, list(reversed(runs)))
    page = render_page(replace(model, description=evil),
                       select_page(model, SeriesFilter(), 1), SeriesFilter())
    assert "<script" not in page
    assert "&lt;script&gt;" in page
    for series in model.series:
        svg = series_svg(series)
        assert "<script" not in svg
        root = _parsed(svg)  # still well-formed XML: the control characters are gone
        assert not list(root.iter(f"{SVG}script"))


def test_the_fixture_filter_is_a_list_until_the_fixtures_would_swell_the_page() -> None:
    def page_of(fixtures: int) -> str:
        run = make_run("wide", figures=[fig("kv_mib", 1.0, key=figure_key(fixture=f"f{i}"))
                                        for i in range(fixtures)])
        model = build_model("b", "h", 60, "0" * 16, [run])
        return render_page(model, select_page(model, SeriesFilter(), 1), SeriesFilter())

    # Fixtures: "all" and the 200; metrics: "all" and kv_mib.
    assert page_of(200).count("<option") == (1 + 200) + (1 + 1)
    wide = page_of(201)
    assert '<input type="text" name="fixture"' in wide
    assert wide.count("<option") == 2  # only the metric list: all and kv_mib


# -- the browser -------------------------------------------------------------------


@pytest.fixture
def browser() -> Iterator[Browser]:
    skip_unless_present("chromium", NO_CHROMIUM)
    yield from launch_chromium()


def test_chromium_draws_one_point_per_stored_run_each_linking_to_its_report(
        tmp_path: Path, browser: Browser) -> None:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    stored = _nightlies()
    # The last night carries a bisect (the nightly's HARNESS_NIGHTLY_BISECT attaches one).
    stored[-1] = replace(stored[-1], bisect=bisect_result(ratios=True).to_json())
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
        plots: list[Response] = []
        page.on("response", lambda r: plots.append(r)
                if urlsplit(r.url).path == "/dashboard/plot.svg" else None)
        page.goto(f"{base}/dashboard")
        assert page.locator("table tr").count() == 3  # the header and two pairs
        page.click(f"text={BRANCH}")
        page.wait_for_load_state()
        assert page.url == f"{base}/dashboard?{query}"

        assert page.locator("section[id='bisects'] li").count() == 1
        titles = [t for t in page.locator("h2").all_inner_texts() if t != "Bisects"]
        assert len(titles) == 3
        images = page.locator("section img")
        assert images.count() == 3
        for number in range(images.count()):
            images.nth(number).scroll_into_view_if_needed()
            # Drawn, not a broken image: the CSP let it load and it parsed as SVG.
            page.wait_for_function("i => i.complete && i.naturalWidth > 0",
                                   arg=images.nth(number).element_handle())
        keep_screenshot(page, tmp_path / "dashboard.png", "dashboard screenshot")
        fetched = {parse_qs(urlsplit(r.url).query)["series"][0]: r for r in plots}
        assert len(fetched) == 3
        assert all(r.status == 200 and r.headers["content-type"] == "image/svg+xml"
                   for r in fetched.values())
        assert page.locator("script").count() == 0
        assert watch.console_errors == [], watch.story()

        sources = [images.nth(i).get_attribute("src") or "" for i in range(3)]
        decode = next(i for i, t in enumerate(titles)
                      if t.startswith("decode_tps") and "tiny-llama" in t)
        for number, source in enumerate(sources):
            # What a click on the plot opens: the plot itself, whose points are links.
            assert page.locator("section a").nth(number).get_attribute("href") == source
            _check_plot(browser, f"{base}{source}", stored, base if number == decode else None)
        assert watch.off_host == []
        page.close()


def _check_plot(browser: Browser, url: str, stored: list[RunRecord],
                base_of_decode: str | None) -> None:
    """One plot opened in Chromium: a point per stored run; for the decode series (given
    the service's base URL) its links, marks, band, prediction and A/B verdict."""
    plot, watch = local_page(browser)
    shown = plot.goto(url)
    assert shown is not None
    assert shown.headers["content-security-policy"] == PLOT_CSP
    assert plot.locator("g[id='points'] circle").count() == len(stored)
    assert plot.locator("script").count() == 0
    if base_of_decode is not None:
        links = plot.locator("g[id='points'] a")
        assert [links.nth(i).get_attribute("href") for i in range(links.count())] \
            == [report_url(run.run_id) for run in stored]
        assert plot.locator("g[id='regressed'] path").count() == 1
        assert plot.locator("g[id='improved']").count() == 0
        assert plot.locator("g[id='predicted'] polyline").count() == 1
        assert plot.locator("g[id='band']").count() == 1
        assert "A/B unchanged" in (plot.locator("g[id='ab']").text_content() or "")
        assert plot.locator("g[id='bisect'] line").count() == 1
        assert (plot.locator("g[id='bisect'] text").text_content() or "") \
            == "bisect: 2 candidates"
        links.last.click()
        plot.wait_for_load_state()
        assert plot.url == f"{base_of_decode}{report_url(stored[-1].run_id)}"
    assert watch.off_host == []
    plot.close()
