"""The dashboard's HTTP routes: ``GET /dashboard`` and ``GET /dashboard/plot.svg``.

- ``/dashboard`` without both ``branch`` and ``hardware``: the index of every branch and
  hardware with runs (either one filters it), ``page`` by page.
- ``/dashboard?branch=&hardware=[&limit=60][&fixture=][&metric=][&changed=1][&page=]``:
  one page of the series of that branch on that hardware over its newest ``limit`` runs,
  each an ``<img>`` of its plot.
- ``/dashboard/plot.svg?branch=&hardware=&limit=&series=&v=``: one series' plot, as the
  page links it; 404 for a series those runs do not have.

What makes a warm request cheap (harness/service/dashboard_view.py says why the keys
hold): a request first reads the ids of the runs in its window (one small query), and
the judged series of those runs — the page model — is built once per set of runs and
kept (:class:`~harness.service.dashboard_cache.MadeOnce`), as is every plot drawn,
under the hash of what it draws. A page answers with an ETag over the runs, filter and
page it shows (304 when the browser has it); a plot with the hash as its ETag, and, when
its URL's ``v`` still names the runs it shows, as immutable for a year.
"""

from __future__ import annotations

import hashlib
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from harness.results.release_runs import RELEASES_BRANCH, matrix_from_runs
from harness.results.run_record import METRICS
from harness.results.store import ResultsStore
from harness.service.dashboard_cache import MadeOnce
from harness.service.dashboard_page import (
    PAGE_CSP,
    PAGE_PATH,
    PAGE_VERSION,
    PLOT_CSP,
    PLOT_PATH,
    RELEASES_PATH,
    plot_version,
    render_index,
    render_page,
)
from harness.service.dashboard_reads import DashboardReads
from harness.service.dashboard_releases import render_matrix, render_release_index
from harness.service.dashboard_svg import series_svg, svg_key
from harness.service.dashboard_view import (
    INDEX_PAGE_SIZE,
    DashboardModel,
    SeriesFilter,
    build_model,
    select_page,
    window_version,
)
from harness.service.params import Choice, Count, Text, shown

#: What each dashboard route answers (merged into the app's ROUTE_STATUSES).
DASHBOARD_STATUSES: dict[tuple[str, str], frozenset[int]] = {
    ("GET", PAGE_PATH): frozenset({200, 304, 400}),
    ("GET", PLOT_PATH): frozenset({200, 304, 400, 404}),
    ("GET", RELEASES_PATH): frozenset({200, 400}),
}
#: Stored release runs the matrix page reads: the newest run of each release among them.
RELEASE_RUNS = 500
#: Points (and series) of the page models kept: about 60 MB, some twenty main-job pages.
MODEL_CACHE_WEIGHT = 200_000
#: Bytes of drawn plots kept: some 2,500 plots of 60 runs.
PLOT_CACHE_BYTES = 32 << 20
#: A plot whose URL names the runs it shows never changes.
_FOREVER = "public, max-age=31536000, immutable"

_BRANCH, _HARDWARE = Text("branch"), Text("hardware")
#: Runs one page draws: enough for two months of nightlies, few enough for one plot.
_LIMIT = Count("limit", 60, 1, 200)
_PAGE = Count("page", 1, 1, 1_000_000)
_FIXTURE = Text("fixture")
_METRIC = Choice("metric", "all", ("all", *METRICS))
_CHANGED = Choice("changed", "0", ("0", "1"))
_SERIES = Text("series", required=True)
_VERSION = Text("v")


class Dashboard:
    """The dashboard's handlers over ``store``, and the caches they share."""

    def __init__(self, store: ResultsStore, reads: DashboardReads) -> None:
        self.store = store
        self.reads = reads
        self.models: MadeOnce[tuple[str, str, int, tuple[str, ...]], DashboardModel] = \
            MadeOnce(MODEL_CACHE_WEIGHT, lambda model: model.weight)
        self.plots: MadeOnce[str, bytes] = MadeOnce(PLOT_CACHE_BYTES, len)

    def routes(self) -> list[Route]:
        return [Route(PAGE_PATH, self.page, methods=["GET"]),
                Route(PLOT_PATH, self.plot, methods=["GET"]),
                Route(RELEASES_PATH, self.releases, methods=["GET"])]

    async def releases(self, request: Request) -> Response:
        """The release matrix of one hardware, or the hardware that have one."""
        hardware = _HARDWARE.read(request.query_params)

        def answer() -> str:
            if not hardware:
                return render_release_index(self.store.run_pairs(branch=RELEASES_BRANCH))
            runs = self.store.list_runs(branch=RELEASES_BRANCH, hardware=hardware,
                                        limit=RELEASE_RUNS)
            return render_matrix(hardware, matrix_from_runs(runs))

        return HTMLResponse(await run_in_threadpool(answer), headers={
            "Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-cache"})

    def model(self, branch: str, hardware: str, limit: int) -> DashboardModel:
        """The page model of the runs in the window now, built when they are new."""
        ids = self.reads.window(branch, hardware, limit)
        version = window_version(ids)

        def make() -> DashboardModel:
            loaded = (self.store.list_runs(branch=branch, hardware=hardware, limit=limit)
                      if ids else [])
            return build_model(branch, hardware, limit, version, loaded)

        return self.models.get_or_make((branch, hardware, limit, ids), make)

    async def page(self, request: Request) -> Response:
        params = request.query_params
        branch, hardware = _BRANCH.read(params), _HARDWARE.read(params)
        page = _PAGE.read(params)
        headers = {"Content-Security-Policy": PAGE_CSP, "Cache-Control": "no-cache"}
        if not branch or not hardware:
            filters = {k: v for k, v in (("branch", branch), ("hardware", hardware)) if v}
            rows = await run_in_threadpool(self.reads.index, branch, hardware, page,
                                           INDEX_PAGE_SIZE)
            return HTMLResponse(render_index(rows, filters), headers=headers)
        limit = _LIMIT.read(params)
        metric = _METRIC.read(params)
        chosen = SeriesFilter(fixture=_FIXTURE.read(params),
                              metric=None if metric == "all" else metric,
                              changed_only=_CHANGED.read(params) == "1")
        if_none_match = request.headers.get("if-none-match")

        def answer() -> Response:
            model = self.model(branch, hardware, limit)
            etag = _etag(PAGE_VERSION, model.version, branch, hardware, limit, chosen, page)
            tagged = {**headers, "ETag": etag}
            if _matches(if_none_match, etag):
                return Response(status_code=304, headers=tagged)
            return HTMLResponse(render_page(model, select_page(model, chosen, page), chosen),
                                headers=tagged)

        return await run_in_threadpool(answer)

    async def plot(self, request: Request) -> Response:
        params = request.query_params
        branch, hardware = _BRANCH.read(params), _HARDWARE.read(params)
        if not branch or not hardware:
            return _error(400, "a plot needs ?branch=NAME&hardware=IDENTITY&series=ID, as "
                          "the dashboard page links it")
        limit, ident, asked = _LIMIT.read(params), _SERIES.read(params), _VERSION.read(params)
        if_none_match = request.headers.get("if-none-match")

        def answer() -> Response:
            model = self.model(branch, hardware, limit)
            series = model.by_id.get(ident or "")
            if series is None:
                return _error(404, f"branch {shown(branch)} on {shown(hardware)} has no "
                              f"series {shown(ident or '')} in its newest {limit} runs; its "
                              "dashboard page links every plot it has")
            key = svg_key(series)
            headers = {
                "ETag": f'"{key}"', "Content-Security-Policy": PLOT_CSP,
                # Another v (a page drawn before the newest run) is answered with what
                # the runs are now, which that URL may not keep.
                "Cache-Control": _FOREVER if asked == plot_version(model) else "no-cache"}
            if _matches(if_none_match, headers["ETag"]):
                return Response(status_code=304, headers=headers)
            body = self.plots.get_or_make(key, lambda: series_svg(series).encode("utf-8"))
            return Response(body, media_type="image/svg+xml", headers=headers)

        return await run_in_threadpool(answer)


def _etag(*parts: Any) -> str:
    return '"' + hashlib.sha256(repr(parts).encode("utf-8", "surrogatepass")).hexdigest()[:24] \
        + '"'


def _matches(if_none_match: str | None, etag: str) -> bool:
    """Whether ``If-None-Match`` names ``etag`` (weak comparison, as RFC 9110 says)."""
    if not if_none_match:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag in tags


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
