"""The results service as an ASGI application: ``create_app(settings)``.

Endpoints (JSON unless said otherwise; errors are ``{"error": "<what and the fix>"}``):

- ``POST /api/runs`` (bearer token): body is a run bundle (``application/gzip``).
  201 ``{"run_id", "created": true, ...}`` for a new run, 200 with ``created: false``
  when the run id was already stored (nothing is changed), 401 without the right
  token, 413 over the size limits, 415 for another content type, 422 for a bundle
  that is refused (the reason names the member), 503 when the store is down.
- ``PUT /api/runs/{run_id}/bisect`` (bearer token): body is a bisect object
  (``application/json``, as ``harness bisect --json`` prints it) that explains the
  stored run's regression; it replaces the run's bisect. 200 with the run id and the
  bisect, 401, 404 for an unknown run, 413 over 1 MiB, 415 for another content type,
  422 for a bisect the run.json schema refuses.
- ``GET /api/runs?branch=&hardware=&limit=``: run summaries, newest first.
- ``GET /api/runs/{run_id}``: the whole run record and its report state.
- ``GET /api/runs/{run_id}/results?test=NODEID`` (or ``?result=ID``): that test's Allure
  results (or one result's, by its uuid or Allure 3's id), newest first, with their text
  attachments and the run's ``environment.properties`` — what ``harness repro`` needs.
- ``GET /api/compare?base=SELECTOR&head=RUN_ID[&window&threshold&z&min_runs]
  [&format=markdown]``: what ``harness compare`` says; 409 on a hardware mismatch,
  404 for an unknown run or baseline.
- ``GET /api/history?branch=&hardware=[&metric=&key=&limit=]``: one branch on one
  hardware (a ``Hardware.identity``), oldest run first, with outcome counts and figure
  medians (of one metric, and of one figure key by its label, when given).
- ``GET /dashboard?branch=&hardware=[&limit=&fixture=&metric=&changed=&page=]``: the
  performance dashboard of one branch on one hardware (HTML, a page of plots of figure
  keys and metrics; no JavaScript); without both, the index of every branch and hardware
  with runs (either one filters it). ``GET /dashboard/plot.svg``: one of its plots.
  Both are :mod:`harness.service.dashboard_routes`.
- ``GET /runs/{run_id}/report/...``: the run's Allure report (202 while it is being
  made, 404 when it failed or there is none).
- ``GET /healthz``: 200 once the store answers, 503 otherwise.

Every route: 400 for a query parameter or path that is refused (the message names it;
:mod:`harness.service.params`), 408 when the client stops sending mid-request
(:mod:`harness.service.idle`), and 500 with only a request id when something
unexpected failed (:mod:`harness.service.guard`; the traceback is in the log).
``ROUTE_STATUSES`` below is the table of what each route answers, which the route
fuzz test holds the service to.

Decision: only writes (uploads, a run's bisect) need the token. Reads are open, because
what the service holds (test outcomes, figures, reports) is what CI logs already show,
and links to reports and comparisons must open from a pull request without credentials.
Put the service behind a proxy with authentication if the results are not for everyone
who can reach it.

Several processes may share one data directory (replicas, docs/service.md): uploads
of one run id meet on a file lock there, report jobs are claimed in the store.

The module stays whole because it is one job, the HTTP surface: each handler only turns
a request into calls on the store, the ingestor and the report worker and their answers
into the statuses of ``ROUTE_STATUSES``, and the route table, that table and the handlers
change together; the parsing, summaries, bundle checks and report files they lean on are
modules of their own.
"""

from __future__ import annotations

import hmac
import logging
import shutil
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import (
    FileResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
)
from starlette.routing import Route

from harness.errors import ConfigError, HarnessError
from harness.facts.gpu import GpuConfig
from harness.probes.gpu_configs import load_gpu_configs
from harness.results.baseline_selection import select_baseline
from harness.results.comparison import HardwareMismatchError, compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.noise_rule import NoiseRule
from harness.results.rules import NOISE_MIN_RUNS, NOISE_THRESHOLD, NOISE_WINDOW, NOISE_Z
from harness.results.run_record import METRICS
from harness.results.run_validation import RunRecordError, with_bisect
from harness.results.store import ResultsStore, open_store
from harness.results.store_backends import ResultsStoreError
from harness.service import summaries
from harness.service.bundle import BundleRejectedError, BundleTooLargeError
from harness.service.dashboard_reads import DashboardReads
from harness.service.dashboard_routes import DASHBOARD_STATUSES, Dashboard
from harness.service.guard import RequestGuard
from harness.service.ingest import Ingested, Ingestor
from harness.service.layout import Layout, is_valid_run_id
from harness.service.params import BadRequest, Choice, Count, Ratio, Text, report_path, shown
from harness.service.report_files import report_file_headers
from harness.service.reports import ReportWorker, read_state, read_states
from harness.service.results import find_results, read_environment
from harness.service.settings import ServiceSettings

log = logging.getLogger(__name__)

GZIP_TYPES = frozenset({"application/gzip", "application/x-gzip"})

#: What each route answers, by (method, path as routed). 5xx is never listed: it means
#: the service itself is broken (503: its store is down). 408 comes from the idle timer
#: (harness.service.idle) on any route. The route fuzz test holds every answer to this
#: table, by the route the request reached (a run id of "." is a dot segment a client
#: folds away, so ``/api/runs/./bisect`` arrives as another path), and fails for a route
#: of the app that is missing from it.
ROUTE_STATUSES: dict[tuple[str, str], frozenset[int]] = {
    ("POST", "/api/runs"): frozenset({200, 201, 400, 401, 413, 415, 422}),
    ("GET", "/api/runs"): frozenset({200, 400}),
    ("PUT", "/api/runs/{run_id}/bisect"): frozenset({200, 400, 401, 404, 413, 415, 422}),
    ("GET", "/api/runs/{run_id}"): frozenset({200, 404}),
    ("GET", "/api/runs/{run_id}/results"): frozenset({200, 400, 404}),
    ("GET", "/api/compare"): frozenset({200, 400, 404, 409}),
    ("GET", "/api/history"): frozenset({200, 400}),
    **DASHBOARD_STATUSES,
    ("GET", "/runs/{run_id}/report"): frozenset({307, 404}),
    ("GET", "/runs/{run_id}/report/{path:path}"): frozenset({200, 202, 400, 404}),
    ("GET", "/healthz"): frozenset({200}),
}
#: A bisect object: ~20 probes of a few hundred bytes each; its evidence is capped.
MAX_BISECT_BYTES = 1024 * 1024
DEFAULT_LIST_LIMIT = 50
MAX_LIST_LIMIT = 1000
#: Runs a history answers unless asked for more: the dashboard's window, two months of
#: nightlies. A whole main-job history of 1,000 runs is 56 MB of medians and takes
#: seconds; with ``metric`` and ``key`` it is small at any limit.
DEFAULT_HISTORY_LIMIT = 60


def _error(status: int, message: str, *, headers: dict[str, str] | None = None,
           **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status, headers=headers)


def _run_not_found(run_id: str) -> JSONResponse:
    return _error(404, f"no run {run_id!r} is stored; GET /api/runs lists the stored runs")


class _Service:
    """The handlers and what they share; one per app."""

    def __init__(self, settings: ServiceSettings, store: ResultsStore) -> None:
        self.settings = settings
        self.layout = Layout(settings.data_dir, settings.replica)
        self.store = store
        self.reports = ReportWorker(self.layout, store, settings.report_generator,
                                    replica=settings.replica,
                                    lease_s=settings.report_lease_s)
        self.ingestor = Ingestor(self.layout, store,
                                 max_unpacked_bytes=settings.max_unpacked_bytes,
                                 max_members=settings.max_members)
        self._token = settings.token.encode()
        self.configs = _card_configs()

    # -- upload -----------------------------------------------------------------

    def _unauthorised(self, request: Request) -> Response | None:
        scheme, _, value = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return _error(401, "uploads need the service's token: send "
                          "'Authorization: Bearer <token>' (harness upload --token or "
                          "HARNESS_SERVICE_TOKEN)", headers=_bearer())
        # Constant-time, so the token cannot be guessed a byte at a time from timings.
        if not hmac.compare_digest(value.strip().encode(), self._token):
            return _error(401, "the bearer token is wrong; use the token the service was "
                          "started with (HARNESS_SERVICE_TOKEN)",
                          headers=_bearer("invalid_token"))
        return None

    async def post_run(self, request: Request) -> Response:
        refused = self._unauthorised(request)
        if refused is not None:
            return refused
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media not in GZIP_TYPES:
            return _error(415, f"the body must be a run bundle sent as application/gzip, not "
                          f"{media or 'untyped'}; `harness upload` builds and sends one")
        limit = self.settings.max_upload_bytes
        declared = request.headers.get("content-length")
        if declared is not None:
            if not declared.isascii() or not declared.isdigit() or len(declared) > 20:
                return _error(400, f"Content-Length {shown(declared)} is not a number")
            if int(declared) > limit:
                return self._too_large(int(declared))
        upload = self.layout.tmp_dir / f"upload-{uuid.uuid4().hex}.tar.gz"
        try:
            received = await self._receive(request, upload, limit)
            if received > limit:
                return self._too_large(received, streamed=True)
            return await run_in_threadpool(self._ingest, upload)
        except ClientDisconnect:
            return _error(400, "the client went away before the whole bundle arrived")
        finally:
            await run_in_threadpool(upload.unlink, True)

    async def put_bisect(self, request: Request) -> Response:
        refused = self._unauthorised(request)
        if refused is not None:
            return refused
        media = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if media != "application/json":
            return _error(415, f"the body must be a bisect object sent as application/json, "
                          f"not {media or 'untyped'}; `harness bisect --attach` sends one")
        body = bytearray()
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > MAX_BISECT_BYTES:
                    return _error(413, f"a bisect is at most {MAX_BISECT_BYTES} bytes")
        except ClientDisconnect:
            return _error(400, "the client went away before the whole bisect arrived")
        return await run_in_threadpool(self._attach_bisect, request.path_params["run_id"],
                                       bytes(body))

    def _attach_bisect(self, run_id: str, body: bytes) -> Response:
        run = self.store.get_run(run_id) if is_valid_run_id(run_id) else None
        if run is None:
            return _run_not_found(run_id)
        try:
            explained = with_bisect(run, body, source=f"the bisect of run {run_id}")
        except RunRecordError as exc:
            return _error(422, f"bisect refused: {exc}")
        if not self.store.set_bisect(explained):
            return _run_not_found(run_id)
        return JSONResponse({"run_id": run_id, "bisect": explained.bisect})

    async def _receive(self, request: Request, upload: Path, limit: int) -> int:
        """Stream the body into ``upload``; stops (returning > limit) once it passes limit."""
        received = 0
        handle = await run_in_threadpool(upload.open, "xb")
        try:
            async for chunk in request.stream():
                received += len(chunk)
                if received > limit:
                    return received
                await run_in_threadpool(handle.write, chunk)
        finally:
            await run_in_threadpool(handle.close)
        return received

    def _too_large(self, size: int, *, streamed: bool = False) -> Response:
        what = f"more than {size - 1}" if streamed else str(size)
        return _error(413, f"the bundle is {what} bytes; this service accepts uploads of up "
                      f"to {self.settings.max_upload_bytes} bytes (serve "
                      "--max-upload-bytes / HARNESS_SERVICE_MAX_UPLOAD)")

    def _ingest(self, upload: Path) -> Response:
        try:
            done = self.ingestor.ingest(upload)
        except BundleTooLargeError as exc:
            return _error(413, str(exc))
        except (BundleRejectedError, RunRecordError) as exc:
            return _error(422, f"bundle refused: {exc}")
        except ResultsStoreError as exc:
            return _error(503, str(exc))
        if done.files_placed:
            self.reports.submit()
        return self._upload_answer(done)

    def _upload_answer(self, done: Ingested) -> Response:
        run_id = done.run.run_id
        body = {"run_id": run_id, "created": done.created, "url": f"/api/runs/{run_id}",
                "report": read_state(self.store, run_id)}
        return JSONResponse(body, status_code=201 if done.created else 200)

    # -- reading ----------------------------------------------------------------

    async def list_runs(self, request: Request) -> Response:
        params = request.query_params
        branch, hardware = _BRANCH.read(params), _HARDWARE.read(params)
        limit = _LIST_LIMIT.read(params)

        def read() -> list[dict[str, Any]]:
            # Summaries: a listing reads no run's figures.
            runs = self.store.list_summaries(branch=branch, hardware=hardware, limit=limit)
            reports = read_states(self.store, [run.run_id for run in runs])
            return [summaries.run_summary(run, reports[run.run_id]) for run in runs]

        return JSONResponse({"runs": await run_in_threadpool(read)})

    async def get_run(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]

        def read() -> Response:
            run = self.store.get_run(run_id) if is_valid_run_id(run_id) else None
            if run is None:
                return _run_not_found(run_id)
            return JSONResponse(summaries.run_detail(run, read_state(self.store, run_id)))

        return await run_in_threadpool(read)

    async def get_results(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        test = Text("test").read(request.query_params)
        result_id = Text("result").read(request.query_params)
        if bool(test) == bool(result_id):
            return _error(400, "results need ?test=NODEID (the pytest node id) or ?result=ID "
                          "(a result's uuid, or the id in its report page's address)")

        def read() -> Response:
            if not is_valid_run_id(run_id) or not self.layout.run_dir(run_id).is_dir():
                return _run_not_found(run_id)
            results_dir = self.layout.results_dir(run_id)
            found = find_results(results_dir, test=test, result_id=result_id)
            if not found:
                what = f"test {test!r}" if test else f"result {result_id!r}"
                return _error(404, f"run {run_id!r} holds no Allure result for {what}; its "
                              f"report at /runs/{run_id}/report/ lists the tests it has")
            return JSONResponse({"run_id": run_id, "results": found,
                                 "environment": read_environment(results_dir)})

        return await run_in_threadpool(read)

    async def compare(self, request: Request) -> Response:
        params = request.query_params
        base, head = Text("base").read(params), Text("head").read(params)
        if not base or not head:
            return _error(400, "compare needs ?base=SELECTOR&head=RUN_ID (SELECTOR: "
                          "`latest`, a run id or a branch name)")
        window = _WINDOW.read(params)
        try:
            rule = NoiseRule(threshold=_THRESHOLD.read(params), z=_Z.read(params),
                             min_runs=_MIN_RUNS.read(params))
        except ConfigError as exc:
            return _error(400, f"bad comparison parameter: {exc}")
        markdown = _FORMAT.read(params) == "markdown"

        def run() -> Response:
            current = self.store.get_run(head)
            if current is None:
                return _run_not_found(head)
            try:
                comparison = compare(select_baseline(self.store, base, current, window),
                                     current, rule, self.configs)
            except HardwareMismatchError as exc:
                return _error(409, str(exc), base_hardware=exc.baseline.describe(),
                              head_hardware=exc.current.describe())
            except ConfigError as exc:
                return _error(400, str(exc))
            except ResultsStoreError:
                raise
            except HarnessError as exc:
                # An unknown baseline, or one with nothing to compare against.
                return _error(404, str(exc))
            if markdown:
                return PlainTextResponse(comparison_markdown(comparison),
                                         media_type="text/markdown; charset=utf-8")
            return JSONResponse(comparison_json(comparison))

        return await run_in_threadpool(run)

    async def history(self, request: Request) -> Response:
        params = request.query_params
        branch, hardware = _BRANCH.read(params), _HARDWARE.read(params)
        if not branch or not hardware:
            return _error(400, "history needs ?branch=NAME&hardware=IDENTITY (the "
                          "hardware.identity of a run, as GET /api/runs shows it)")
        limit = _HISTORY_LIMIT.read(params)
        metric, key = _METRIC.read(params), _KEY.read(params)
        if metric is not None and metric not in METRICS:
            return _error(400, f"metric {shown(metric)} is not one the harness records; "
                          f"use one of {', '.join(METRICS)}")

        def read() -> dict[str, Any]:
            runs = self.store.list_summaries(branch=branch, hardware=hardware, limit=limit)
            ids = [run.run_id for run in runs]
            figures = self.store.figures_of(ids, metric=metric, key=key)
            return summaries.history(branch, hardware, runs, figures,
                                     read_states(self.store, ids))

        return JSONResponse(await run_in_threadpool(read))

    async def report_root(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if not is_valid_run_id(run_id):
            return _run_not_found(run_id)
        return RedirectResponse(f"/runs/{run_id}/report/")

    async def report(self, request: Request) -> Response:
        run_id = request.path_params["run_id"]
        if not is_valid_run_id(run_id):
            return _run_not_found(run_id)
        rel = report_path(request.path_params.get("path", ""))
        return await run_in_threadpool(self._report_file, run_id, rel)

    def _report_file(self, run_id: str, rel: str) -> Response:
        state = read_state(self.store, run_id)
        if state["state"] == "pending":
            return JSONResponse({"state": "pending", "message": "the report is being made; "
                                 "try again shortly"}, status_code=202,
                                headers={"Retry-After": "5"})
        if state["state"] != "ready":
            return _error(404, f"run {run_id!r} has no report: {state['message']}")
        root = self.layout.report_dir(run_id).resolve()
        target = (root / rel).resolve()
        # resolve() follows links and "..": whatever the path, it must end up inside.
        if not target.is_relative_to(root):
            return _error(404, f"{rel!r} is not part of the report")
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            return _error(404, f"{rel!r} is not part of the report of run {run_id!r}")
        return FileResponse(target, headers=report_file_headers(root, target))

    async def healthz(self, request: Request) -> Response:
        try:
            await run_in_threadpool(self.store.list_runs, limit=1)
        except ResultsStoreError as exc:
            return JSONResponse({"status": "unavailable", "error": str(exc)}, status_code=503)
        return JSONResponse({"status": "ok"})


def _card_configs() -> tuple[GpuConfig, ...]:
    """The card configs comparisons hold decode speeds against (their calibrated figures);
    a broken one turns the drift report off rather than the service."""
    try:
        return load_gpu_configs()
    except ConfigError as exc:
        log.warning("no drift reports against measured card figures: %s", exc)
        return ()


def _bearer(error: str | None = None) -> dict[str, str]:
    value = 'Bearer realm="harness"' + (f', error="{error}"' if error else "")
    return {"WWW-Authenticate": value}


_BRANCH, _HARDWARE = Text("branch"), Text("hardware")
#: History of one metric, and of one figure key by its label (as the history shows it).
_METRIC, _KEY = Text("metric"), Text("key")
_LIST_LIMIT = Count("limit", DEFAULT_LIST_LIMIT, 1, MAX_LIST_LIMIT)
_HISTORY_LIMIT = Count("limit", DEFAULT_HISTORY_LIMIT, 1, MAX_LIST_LIMIT)
#: Bounds wide enough for any real comparison, narrow enough that no value can
#: overflow a database LIMIT or turn the noise arithmetic into inf.
_WINDOW = Count("window", NOISE_WINDOW, 1, MAX_LIST_LIMIT)
_THRESHOLD = Ratio("threshold", NOISE_THRESHOLD, 0.0, 10.0)
_Z = Ratio("z", NOISE_Z, 0.0, 1000.0)
_MIN_RUNS = Count("min_runs", NOISE_MIN_RUNS, 2, MAX_LIST_LIMIT)
_FORMAT = Choice("format", "json", ("json", "markdown"))


async def _store_down(request: Request, exc: Exception) -> Response:
    return _error(503, str(exc))


async def _bad_request(request: Request, exc: Exception) -> Response:
    return _error(400, str(exc))


def _clear_tmp(layout: Layout) -> None:
    """Uploads and reports this replica's previous process was in the middle of are
    gone with it.

    Only this replica's own folder under tmp/ (other replicas sharing the data dir keep
    theirs), what older services left in tmp/ and beside runs' reports. Processes are
    not looked for: the report CLI a killed replica started died with it
    (PR_SET_PDEATHSIG).
    """
    for leftover in [*layout.tmp_leftovers(), *layout.report_leftovers()]:
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def create_app(settings: ServiceSettings,
               open_results: Callable[[str | None], ResultsStore] = open_store) -> Starlette:
    """The service for ``settings``; opens the store now so a bad URL fails at start.

    The store is closed and the report worker stopped when the app shuts down (ASGI
    lifespan). ``app.state.service.reports.wait_idle(timeout)`` waits for queued reports.
    """
    layout = Layout(settings.data_dir, settings.replica)
    try:
        layout.create()
    except OSError as exc:
        raise ConfigError(f"cannot create the service's data directory {settings.data_dir}: "
                          f"{exc.strerror or exc}; pass a writable --data-dir") from exc
    _clear_tmp(layout)
    store = open_results(settings.results_url)
    service = _Service(settings, store)
    dashboard = Dashboard(store, DashboardReads(store))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # Store queries (the reports a killed process left unmade): off the event loop.
        await run_in_threadpool(service.reports.start)
        try:
            yield
        finally:
            await run_in_threadpool(service.reports.stop)
            store.close()

    app = Starlette(
        routes=[
            Route("/api/runs", service.post_run, methods=["POST"]),
            Route("/api/runs", service.list_runs, methods=["GET"]),
            Route("/api/runs/{run_id}", service.get_run, methods=["GET"]),
            Route("/api/runs/{run_id}/bisect", service.put_bisect, methods=["PUT"]),
            Route("/api/runs/{run_id}/results", service.get_results, methods=["GET"]),
            Route("/api/compare", service.compare, methods=["GET"]),
            Route("/api/history", service.history, methods=["GET"]),
            *dashboard.routes(),
            Route("/runs/{run_id}/report", service.report_root, methods=["GET"]),
            Route("/runs/{run_id}/report/{path:path}", service.report, methods=["GET"]),
            Route("/healthz", service.healthz, methods=["GET"]),
        ],
        exception_handlers={ResultsStoreError: _store_down, BadRequest: _bad_request},
        middleware=[Middleware(RequestGuard)],
        lifespan=lifespan,
    )
    # One URL per resource: Starlette would answer a path that matches no route but ends
    # in "/" with a redirect to the path without it, so GET /api/runs/%2F (a request for
    # the run "/") was sent to the list of runs. Such a path is a 404 instead.
    app.router.redirect_slashes = False
    app.state.service = service
    app.state.dashboard = dashboard
    log.info("results service on %s, data in %s", store.url_for_display, settings.data_dir)
    return app
