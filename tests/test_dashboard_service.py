"""The dashboard as the service answers it: pages and filters, caches, HTTP caching, queries.

A warm request draws nothing: the page model and every plot are made once per set of
runs (counted by the caches), a new run makes new ones, and a browser that has a page
or a plot gets 304. A run with many figure keys is paged and filtered, never drawn
whole. The two store queries (the window of a page, the index) are run on each backend
and held to what loading the runs says.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from urllib.parse import urlencode

import httpx
import pytest
import results_fixtures
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, figure_key, make_run
from service_helpers import no_report
from starlette.applications import Starlette

from harness.results.run_record import RunRecord
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.dashboard_cache import MadeOnce
from harness.service.dashboard_page import PAGE_CSP, PLOT_CSP
from harness.service.dashboard_reads import DashboardReads
from harness.service.dashboard_routes import Dashboard
from harness.service.dashboard_view import PAGE_SIZE, window_version
from harness.service.settings import ServiceSettings

store_url = results_fixtures.store_url

HW = CPU_BOX.identity
IMG = re.compile(r'<img src="([^"]+)"')


def _nights(count: int, branch: str = "main") -> list[RunRecord]:
    """``count`` nights of two keys and two metrics; the last night's decode drops."""
    runs = []
    for night in range(count):
        drop = 0.6 if night == count - 1 and count > 4 else 1.0
        run_id = f"{branch.replace('/', '-')}-{night}"
        runs.append(make_run(run_id, branch=branch, started_at=at(night),
                             figures=[fig("decode_tps", 100.0 * drop + night % 2),
                                      fig("ttft_ms", 20.0),
                                      fig("decode_tps", 50.0, key=figure_key(fixture="bench")),
                                      fig("ttft_ms", 30.0, key=figure_key(fixture="bench"))]))
    return runs


def _wide_run(keys: int) -> RunRecord:
    """One run with ``keys`` figure keys, one decode figure each."""
    return make_run("wide", branch="wide", started_at=at(0), figures=[
        fig("decode_tps", 10.0 + i, key=figure_key(fixture=f"fx{i % 3}", n_prompt=i + 1))
        for i in range(keys)])


@dataclass
class Running:
    url: str
    app: Starlette
    store_url: str

    @property
    def dashboard(self) -> Dashboard:
        found: Dashboard = self.app.state.dashboard
        return found

    def get(self, path: str, **params: str | int) -> httpx.Response:
        query = f"?{urlencode(params)}" if params else ""
        return httpx.get(f"{self.url}{path}{query}", timeout=60)

    def add(self, *runs: RunRecord) -> None:
        with open_store(self.store_url) as store:
            for run in runs:
                assert store.add_run(run)


@pytest.fixture
def running(tmp_path: Path) -> Iterator[Running]:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token="t" * 32,
                                     results_url=url, report_generator=no_report))
    with serve_in_thread(app) as base:
        yield Running(base, app, url)


def _plots(page: str) -> list[str]:
    return [unescape(src) for src in IMG.findall(page)]


def test_a_warm_page_and_its_plots_draw_nothing(running: Running) -> None:
    running.add(*_nights(7))
    page = running.get("/dashboard", branch="main", hardware=HW)
    assert page.status_code == 200
    assert page.headers["content-security-policy"] == PAGE_CSP
    assert page.headers["cache-control"] == "no-cache"
    plots = _plots(page.text)
    assert len(plots) == 4
    first = [httpx.get(f"{running.url}{p}", timeout=60) for p in plots]
    assert all(a.status_code == 200 and a.headers["content-type"] == "image/svg+xml"
               for a in first)
    assert all(a.headers["cache-control"] == "public, max-age=31536000, immutable"
               and a.headers["content-security-policy"] == PLOT_CSP for a in first)
    models, drawn = running.dashboard.models.made, running.dashboard.plots.made
    assert (models, drawn) == (1, 4)

    again = running.get("/dashboard", branch="main", hardware=HW)
    assert again.text == page.text
    assert [httpx.get(f"{running.url}{p}", timeout=60).content for p in plots] \
        == [a.content for a in first]
    assert (running.dashboard.models.made, running.dashboard.plots.made) == (models, drawn)

    # What a browser holding them asks: each answer is a 304 with no body.
    query = urlencode({"branch": "main", "hardware": HW})
    revalidated = httpx.get(f"{running.url}/dashboard?{query}",
                            headers={"If-None-Match": page.headers["etag"]}, timeout=60)
    assert revalidated.status_code == 304
    assert revalidated.content == b""
    plot = httpx.get(f"{running.url}{plots[0]}",
                     headers={"If-None-Match": f'W/{first[0].headers["etag"]}'}, timeout=60)
    assert plot.status_code == 304
    assert plot.content == b""


def test_a_new_run_makes_a_new_page_and_stale_plot_urls_are_not_kept(
        running: Running) -> None:
    nights = _nights(8)
    running.add(*nights[:7])
    before = running.get("/dashboard", branch="main", hardware=HW)
    old_plots = _plots(before.text)
    running.add(nights[7])
    after = running.get("/dashboard", branch="main", hardware=HW)
    assert after.headers["etag"] != before.headers["etag"]
    new_plots = _plots(after.text)
    assert set(new_plots).isdisjoint(old_plots)
    assert running.dashboard.models.made == 2
    stale = httpx.get(f"{running.url}{old_plots[0]}", timeout=60)
    # Answered with the runs as they are now, and not to be kept under the old URL.
    assert stale.status_code == 200
    assert stale.headers["cache-control"] == "no-cache"
    assert stale.text.count("<a href=") == 8


def test_many_series_are_paged_and_filtered(running: Running) -> None:
    running.add(_wide_run(130))
    first = running.get("/dashboard", branch="wide", hardware=HW)
    assert len(_plots(first.text)) == PAGE_SIZE
    assert "series 1&ndash;50 of 130 · page 1 of 3" in first.text
    last = running.get("/dashboard", branch="wide", hardware=HW, page=3)
    assert len(_plots(last.text)) == 30
    past = running.get("/dashboard", branch="wide", hardware=HW, page=9)
    assert past.status_code == 200
    assert _plots(past.text) == []
    assert "past the last one" in past.text
    one = running.get("/dashboard", branch="wide", hardware=HW, fixture="fx1")
    assert "of 43 ·" in one.text
    assert all("fx1" in t for t in re.findall("<h2>(.*?)</h2>",
                                                                         one.text))
    assert _plots(running.get("/dashboard", branch="wide", hardware=HW,
                              metric="ttft_ms").text) == []
    assert _plots(running.get("/dashboard", branch="wide", hardware=HW, changed=1).text) \
        == []
    assert running.dashboard.models.made == 1
    assert running.dashboard.plots.made == 0  # the page draws nothing itself


def test_changed_only_keeps_the_series_the_rule_flagged(running: Running) -> None:
    running.add(*_nights(7))
    page = running.get("/dashboard", branch="main", hardware=HW, changed=1)
    titles = [unescape(t) for t in re.findall("<h2>(.*?)</h2>", page.text)]
    assert len(titles) == 1
    assert titles[0].startswith("decode_tps")
    assert "tiny-llama" in titles[0]
    assert "regressed ▼" in page.text


@pytest.mark.parametrize(("params", "said"), [
    ({"metric": "speed"}, "metric 'speed' must be one of all, load_s"),
    ({"changed": "yes"}, "changed 'yes' must be one of 0, 1"),
    ({"page": "0"}, "page '0' must be a whole number from 1"),
    ({"limit": "201"}, "limit '201' must be a whole number from 1 to 200"),
    ({"fixture": "a\x00b"}, "fixture 'a\\x00b' holds a control character"),
])
def test_a_bad_parameter_is_a_400_naming_it(running: Running, params: dict[str, str],
                                             said: str) -> None:
    answer = running.get("/dashboard", branch="main", hardware=HW, **params)
    assert answer.status_code == 400
    assert said in answer.json()["error"]


def test_a_plot_needs_its_page_parameters_and_a_series_the_runs_have(
        running: Running) -> None:
    running.add(*_nights(3))
    assert running.get("/dashboard/plot.svg", series="0" * 16).status_code == 400
    assert running.get("/dashboard/plot.svg", branch="main", hardware=HW).status_code == 400
    missing = running.get("/dashboard/plot.svg", branch="main", hardware=HW, series="0" * 16)
    assert missing.status_code == 404
    assert "dashboard page links every plot" in missing.json()["error"]
    nobody = running.get("/dashboard/plot.svg", branch="nobody", hardware=HW,
                         series="0" * 16)
    assert nobody.status_code == 404


def test_the_index_is_paged_and_counts_each_pair(running: Running) -> None:
    running.add(*_nights(3), *_nights(2, branch="pr/1"),
                make_run("gpu", branch="main", started_at=at(50), hardware=GPU_BOX))
    index = running.get("/dashboard")
    rows = re.findall(r"<tr><td><a href=\"([^\"]+)\">([^<]+)</a></td>.*?<td>(\d+)</td>",
                      index.text)
    assert [(unescape(name), int(n)) for _, name, n in rows] == [
        ("main", 1), ("main", 3), ("pr/1", 2)]
    assert "NVIDIA H100" in index.text
    only = running.get("/dashboard", branch="pr/1")
    assert only.text.count("<tr><td>") == 1
    assert running.get("/dashboard", page=2).text.count("<tr><td>") == 0


# -- the store queries -----------------------------------------------------------------

def test_the_window_is_the_runs_list_runs_gives(store_url: str) -> None:
    runs = [*_nights(5), make_run("same-minute", started_at=at(2)),
            make_run("elsewhere", started_at=at(9), hardware=GPU_BOX)]
    with open_store(store_url) as store:
        for run in runs:
            store.add_run(run)
        reads = DashboardReads(store)
        for limit in (1, 3, 60):
            listed = store.list_runs(branch="main", hardware=HW, limit=limit)
            assert reads.window("main", HW, limit) == tuple(r.run_id for r in listed)
        assert reads.window("nobody", HW, 60) == ()


def test_the_index_query_groups_runs_by_branch_and_hardware(
        store_url: str) -> None:
    with open_store(store_url) as store:
        for run in [*_nights(3), *_nights(4, branch="pr/2"),
                    make_run("gpu", started_at=at(1), hardware=GPU_BOX)]:
            store.add_run(run)
        reads = DashboardReads(store)
        rows = reads.index(None, None, 1, 100)
        assert [(r.branch, r.hardware, r.runs, r.latest) for r in rows.items] == [
            ("pr/2", HW, 4, at(3)), ("main", HW, 3, at(2)),
            ("main", GPU_BOX.identity, 1, at(1))]
        assert rows.items[0].description == CPU_BOX.describe()
        paged = reads.index(None, None, 2, 2)
        assert (paged.total, paged.pages, [r.branch for r in paged.items]) == (
            3, 2, ["main"])
        assert [r.runs for r in reads.index("main", GPU_BOX.identity, 1, 100).items] \
            == [1]


# -- the cache -------------------------------------------------------------------------

def test_the_cache_makes_a_value_once_for_threads_that_ask_together() -> None:
    cache: MadeOnce[str, bytes] = MadeOnce(100, len)
    started = threading.Barrier(8)
    calls = []

    def make() -> bytes:
        calls.append(1)
        time.sleep(0.05)
        return b"x" * 10

    def ask() -> None:
        started.wait()
        assert cache.get_or_make("k", make) == b"x" * 10

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1
    assert cache.made == 1


def test_the_cache_drops_the_least_recently_used_past_its_weight() -> None:
    cache: MadeOnce[str, bytes] = MadeOnce(25, len)
    for key in "abc":
        cache.get_or_make(key, lambda: b"x" * 10)
        cache.get("a")
    assert cache.get("a") is not None
    assert cache.get("b") is None
    assert cache.get("c") is not None
    cache.get_or_make("huge", lambda: b"x" * 100)
    assert cache.get("huge") is None
    assert cache.get("c") is not None


def test_the_window_version_names_the_runs_and_their_order() -> None:
    assert window_version(["a", "b"]) != window_version(["b", "a"])
    assert window_version(["ab"]) != window_version(["a", "b"])
    assert re.fullmatch("[0-9a-f]{16}", window_version([]))
