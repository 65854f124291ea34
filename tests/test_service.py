"""The results service end to end: a real uvicorn server on loopback, a real store.

Every test that stores runs goes through ``POST /api/runs`` with a real bundle, once
per store backend (SQLite and PostgreSQL, see results_fixtures). Reports are made by
a recording stand-in generator, except in the one test that runs the Allure CLI.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from checkout import allure_missing
from results_fixtures import (  # noqa: F401 - store_url is a fixture
    CPU_BOX,
    GPU_BOX,
    KEY,
    at,
    fig,
    figure_key,
    make_run,
    outcome,
    store_url,
)
from service_helpers import tmp_leftovers

from harness.plugin.required import skip_unless_present
from harness.results.run_record import RunRecord
from harness.results.run_summary import RunSummary
from harness.results.run_validation import run_from_json
from harness.results.store import ResultsStore, open_store
from harness.results.store_backends import ResultsStoreError
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import make_bundle
from harness.service.layout import Layout
from harness.service.reports import ReportWorker, pending_state, read_state
from harness.service.settings import ServiceSettings

TOKEN = "test-token-" + "x" * 20
AUTH = {"Authorization": f"Bearer {TOKEN}"}
GZIP = {"Content-Type": "application/gzip"}
REPORT_DEADLINE_S = 180.0


def write_allure_results(into: Path, tests: Sequence[tuple[str, str]]) -> Path:
    """A minimal but valid allure-results folder: one result file per (name, status)."""
    into.mkdir(parents=True, exist_ok=True)
    for name, status in tests:
        result_id = str(uuid.uuid4())
        (into / f"{result_id}-result.json").write_text(json.dumps({
            "uuid": result_id, "historyId": name, "testCaseId": name, "name": name,
            "fullName": f"suites.test_demo#{name}", "status": status, "stage": "finished",
            "start": 1_700_000_000_000, "stop": 1_700_000_000_500,
            "labels": [{"name": "suite", "value": "demo"}],
        }))
    return into


def bundle_bytes(tmp_path: Path, run: RunRecord) -> bytes:
    work = tmp_path / f"bundle-{run.run_id}-{uuid.uuid4().hex}"
    work.mkdir()
    run_json = work / "run.json"
    run_json.write_text(json.dumps(run.to_json()))
    tests = [(o.test_id.rsplit("::", 1)[-1], o.outcome) for o in run.outcomes]
    results = write_allure_results(work / "allure-results", tests or [("test_ok", "passed")])
    return make_bundle(run_json, results, work / "bundle.tar.gz").read_bytes()


@dataclass
class RecordingGenerator:
    """Stands in for Allure: an index.html and one history line per report, recorded."""

    calls: list[tuple[str, Path]] = field(default_factory=list)
    fail_with: str | None = None
    gate: threading.Event | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, results_dir: Path, output_dir: Path, *, history_path: Path,
                 report_name: str) -> Sequence[str]:
        if self.gate is not None:
            self.gate.wait(30)
        run_id = results_dir.parent.name
        with self.lock:
            self.calls.append((run_id, history_path))
        if self.fail_with:
            raise RuntimeError(self.fail_with)
        output_dir.mkdir(parents=True)
        (output_dir / "index.html").write_text(f"<html>{report_name}</html>")
        (output_dir / "data").mkdir()
        (output_dir / "data" / "a.json").write_text("{}")
        with history_path.open("a") as history:
            history.write(json.dumps({"run": run_id}) + "\n")
        return []


@dataclass
class Service:
    url: str
    data_dir: Path
    store_url: str
    generator: RecordingGenerator
    app: Any

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)

    def upload(self, tmp_path: Path, run: RunRecord,
               headers: dict[str, str] | None = None) -> httpx.Response:
        with self.client() as client:
            return client.post("/api/runs", content=bundle_bytes(tmp_path, run),
                               headers={**GZIP, **AUTH} if headers is None else headers)

    def stored(self) -> list[RunRecord]:
        with open_store(self.store_url) as store:
            return store.list_runs()

    def wait_reports(self) -> None:
        assert self.app.state.service.reports.wait_idle(60), "reports did not finish"


ServiceFactory = Callable[..., Service]


@pytest.fixture
def start_service(tmp_path: Path) -> Iterator[ServiceFactory]:
    """Start services (on loopback, port 0); all stopped at the end of the test."""
    with ExitStack() as running:
        def start(results_url: str, *, generator: RecordingGenerator | None = None,
                  open_results: Callable[[str | None], ResultsStore] = open_store,
                  **settings: Any) -> Service:
            data_dir = tmp_path / f"data-{uuid.uuid4().hex[:8]}"
            recorder = generator if generator is not None else RecordingGenerator()
            app = create_app(ServiceSettings(data_dir=data_dir, token=TOKEN,
                                             results_url=results_url,
                                             report_generator=recorder, **settings),
                             open_results=open_results)
            url = running.enter_context(serve_in_thread(app))
            return Service(url, data_dir, results_url, recorder, app)

        yield start


@pytest.fixture
def service(start_service: ServiceFactory, store_url: str) -> Service:  # noqa: F811
    return start_service(store_url)


def test_upload_list_get_and_repeat(service: Service, tmp_path: Path) -> None:
    run = make_run("run-1", outcomes=[outcome("t.py::test_a"),
                                      outcome("t.py::test_b", "failed", message="boom")],
                   figures=[fig("decode_tps", 100.0), fig("decode_tps", 110.0)])
    first = service.upload(tmp_path, run)
    assert first.status_code == 201, first.text
    assert first.json()["created"] is True
    assert first.json()["run_id"] == "run-1"
    stored_json = service.data_dir / "runs" / "run-1" / "run.json"
    before = stored_json.stat().st_mtime_ns

    with service.client() as client:
        listed = client.get("/api/runs").json()["runs"]
        assert [r["run_id"] for r in listed] == ["run-1"]
        assert listed[0]["outcomes"]["passed"] == 1
        assert listed[0]["outcomes"]["failed"] == 1
        assert listed[0]["hardware"] == {"identity": CPU_BOX.identity,
                                         "description": CPU_BOX.describe()}
        detail = client.get("/api/runs/run-1").json()
        assert run_from_json(detail["run"]) == run
        assert client.get("/api/runs/nope").status_code == 404
        assert client.get("/api/runs/..%2Fetc").status_code == 404
        # A run id of "/" (or a trailing slash) names no run: a 404, not a redirect to
        # the list of runs (the route fuzz test found GET /api/runs/%2F -> 307).
        for path in ("/api/runs/%2F", "/api/runs/", "/api/runs/run-1/"):
            assert client.get(path, follow_redirects=False).status_code == 404, path
        assert client.get("/api/runs", params={"branch": "other"}).json()["runs"] == []
        assert client.get("/api/runs", params={"limit": "0"}).status_code == 400

    again = service.upload(tmp_path, run)
    assert again.status_code == 200, again.text
    assert again.json()["created"] is False
    assert service.stored() == [run]
    assert stored_json.stat().st_mtime_ns == before
    service.wait_reports()
    assert [call[0] for call in service.generator.calls] == ["run-1"]


def test_ten_distinct_uploads_at_once_lose_nothing(service: Service, tmp_path: Path) -> None:
    runs = [make_run(f"par-{i}", started_at=at(i)) for i in range(10)]
    bodies = [bundle_bytes(tmp_path, run) for run in runs]

    def send(body: bytes) -> int:
        with service.client() as client:
            return client.post("/api/runs", content=body, headers={**GZIP, **AUTH}).status_code

    with ThreadPoolExecutor(10) as pool:
        codes = list(pool.map(send, bodies))
    assert codes == [201] * 10
    assert sorted(r.run_id for r in service.stored()) == sorted(r.run_id for r in runs)
    for run in runs:
        assert (service.data_dir / "runs" / run.run_id / "allure-results").is_dir()
    service.wait_reports()
    assert sorted(call[0] for call in service.generator.calls) == sorted(r.run_id for r in runs)
    assert tmp_leftovers(service.data_dir) == []


def test_ten_copies_of_one_run_at_once_store_it_once(service: Service,
                                                     tmp_path: Path) -> None:
    body = bundle_bytes(tmp_path, make_run("same"))

    def send(_: int) -> httpx.Response:
        with service.client() as client:
            return client.post("/api/runs", content=body, headers={**GZIP, **AUTH})

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(send, range(10)))
    assert sorted(a.status_code for a in answers) == [200] * 9 + [201]
    assert sum(a.json()["created"] for a in answers) == 1
    assert [r.run_id for r in service.stored()] == ["same"]
    service.wait_reports()
    assert [call[0] for call in service.generator.calls] == ["same"]
    assert sorted(p.name for p in (service.data_dir / "runs").iterdir()) == ["same"]


@pytest.mark.parametrize("headers", [
    pytest.param(GZIP, id="missing"),
    pytest.param({**GZIP, "Authorization": "Bearer wrong"}, id="wrong"),
    pytest.param({**GZIP, "Authorization": f"Basic {TOKEN}"}, id="not-bearer"),
])
def test_uploads_need_the_token(service: Service, tmp_path: Path,
                                headers: dict[str, str]) -> None:
    answer = service.upload(tmp_path, make_run("no-token"), headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"].startswith("Bearer")
    assert "token" in answer.json()["error"]
    assert service.stored() == []
    assert list((service.data_dir / "runs").iterdir()) == []
    assert tmp_leftovers(service.data_dir) == []


def test_upload_needs_gzip_content_type(service: Service, tmp_path: Path) -> None:
    answer = service.upload(tmp_path, make_run("typed"),
                            headers={**AUTH, "Content-Type": "application/json"})
    assert answer.status_code == 415
    assert service.stored() == []


def _bench_run(run_id: str, minute: int, decode: float, *, branch: str = "main",
               hardware: Any = CPU_BOX) -> RunRecord:
    return make_run(run_id, branch=branch, started_at=at(minute), hardware=hardware,
                    outcomes=[outcome("t.py::test_a")],
                    figures=[fig("decode_tps", decode), fig("decode_tps", decode + 1)])


def test_compare_matches_the_cli_and_refuses_other_hardware(service: Service,
                                                             tmp_path: Path) -> None:
    for i, value in enumerate([100.0, 101.0, 99.0, 100.5]):
        assert service.upload(tmp_path, _bench_run(f"base-{i}", i, value)).status_code == 201
    head = _bench_run("head", 10, 50.0, branch="pr-1")
    gpu_head = _bench_run("gpu-head", 11, 100.0, branch="pr-2", hardware=GPU_BOX)
    assert service.upload(tmp_path, head).status_code == 201
    assert service.upload(tmp_path, gpu_head).status_code == 201

    with service.client() as client:
        answer = client.get("/api/compare", params={"base": "main", "head": "head"})
        assert answer.status_code == 200, answer.text
        body = answer.json()
        assert body["regressed"] is True
        assert body["current_run"] == "head"
        assert body["baseline_runs"] == ["base-3", "base-2", "base-1", "base-0"]
        markdown = client.get("/api/compare",
                              params={"base": "main", "head": "head", "format": "markdown"})
        assert markdown.headers["content-type"].startswith("text/markdown")
        assert "Regressed" in markdown.text

        mismatch = client.get("/api/compare", params={"base": "base-0", "head": "gpu-head"})
        assert mismatch.status_code == 409
        refused = mismatch.json()
        assert refused["base_hardware"] == CPU_BOX.describe()
        assert refused["head_hardware"] == GPU_BOX.describe()
        assert CPU_BOX.describe() in refused["error"]
        assert GPU_BOX.describe() in refused["error"]

        assert client.get("/api/compare", params={"base": "main", "head": "nope"}
                          ).status_code == 404
        assert client.get("/api/compare", params={"base": "no-such-branch", "head": "head"}
                          ).status_code == 404
        assert client.get("/api/compare", params={"head": "head"}).status_code == 400
        assert client.get("/api/compare", params={"base": "main", "head": "head",
                                                  "window": "0"}).status_code == 400


def test_history_is_per_branch_and_hardware(service: Service, tmp_path: Path) -> None:
    uploads = [
        _bench_run("main-2", 2, 102.0),
        _bench_run("main-1", 1, 101.0),
        _bench_run("main-gpu", 3, 500.0, hardware=GPU_BOX),
        _bench_run("pr-1", 4, 90.0, branch="pr"),
        _bench_run("main-3", 5, 103.0),
    ]
    for run in uploads:
        assert service.upload(tmp_path, run).status_code == 201
    with service.client() as client:
        answer = client.get("/api/history",
                            params={"branch": "main", "hardware": CPU_BOX.identity})
        assert answer.status_code == 200
        history = answer.json()
        assert client.get("/api/history", params={"branch": "main"}).status_code == 400
    assert [r["run_id"] for r in history["runs"]] == ["main-1", "main-2", "main-3"]
    assert history["hardware"]["description"] == CPU_BOX.describe()
    medians = [r["figures"][0] for r in history["runs"]]
    assert [m["median"] for m in medians] == [101.5, 102.5, 103.5]
    assert {m["metric"] for m in medians} == {"decode_tps"}
    assert history["runs"][0]["outcomes"]["passed"] == 1

    service.wait_reports()
    trend = {run_id: path for run_id, path in service.generator.calls}
    # Reports were made in upload order, each appending to its branch + hardware trend.
    assert [run_id for run_id, _ in service.generator.calls] == [r.run_id for r in uploads]
    assert trend["main-1"] == trend["main-2"] == trend["main-3"]
    assert len({trend["main-1"], trend["main-gpu"], trend["pr-1"]}) == 3
    lines = trend["main-1"].read_text().splitlines()
    assert [json.loads(line)["run"] for line in lines] == ["main-2", "main-1", "main-3"]


def test_history_of_one_metric_and_figure_key(service: Service, tmp_path: Path) -> None:
    dense = figure_key(fixture="dense")
    for minute in (1, 2):
        run = make_run(f"main-{minute}", started_at=at(minute),
                       figures=[fig("decode_tps", 100.0 + minute), fig("load_s", 0.5),
                                fig("decode_tps", 50.0 + minute, key=dense)])
        assert service.upload(tmp_path, run).status_code == 201
    where = {"branch": "main", "hardware": CPU_BOX.identity}
    with service.client() as client:
        decode = client.get("/api/history", params={**where, "metric": "decode_tps"}).json()
        one = client.get("/api/history", params={**where, "metric": "decode_tps",
                                                 "key": dense.label()}).json()
        unknown = client.get("/api/history", params={**where, "metric": "fps"})
    assert [[(f["label"], f["metric"]) for f in r["figures"]] for r in decode["runs"]] == [
        [(dense.label(), "decode_tps"), (KEY.label(), "decode_tps")]] * 2
    assert [[f["median"] for f in r["figures"]] for r in one["runs"]] == [[51.0], [52.0]]
    assert [r["outcomes"]["total"] for r in one["runs"]] == [0, 0]
    assert unknown.status_code == 400
    assert "decode_tps" in unknown.json()["error"]


def test_report_states_pending_ready_and_served(start_service: ServiceFactory,
                                                store_url: str,  # noqa: F811
                                                tmp_path: Path) -> None:
    gate = threading.Event()
    service = start_service(store_url, generator=RecordingGenerator(gate=gate))
    assert service.upload(tmp_path, make_run("slow")).status_code == 201
    with service.client() as client:
        pending = client.get("/runs/slow/report/")
        assert pending.status_code == 202
        assert client.get("/api/runs/slow").json()["report"]["state"] == "pending"
        gate.set()
        service.wait_reports()
        report = client.get("/api/runs/slow").json()["report"]
        assert report == {"state": "ready", "message": None, "problems": [],
                          "url": "/runs/slow/report/"}
        index = client.get("/runs/slow/report/")
        assert index.status_code == 200
        assert "slow" in index.text
        assert client.get("/runs/slow/report/data/a.json").json() == {}
        redirect = client.get("/runs/slow/report")
        assert redirect.status_code in {307, 308}
        assert client.get("/runs/slow/report/..%2F..%2Frun.json").status_code == 404
        assert client.get("/runs/slow/report/missing.js").status_code == 404
        assert client.get("/runs/nope/report/").status_code == 404


def test_a_failing_report_does_not_fail_the_upload(start_service: ServiceFactory,
                                                   store_url: str,  # noqa: F811
                                                   tmp_path: Path) -> None:
    service = start_service(store_url, generator=RecordingGenerator(fail_with="node died"))
    assert service.upload(tmp_path, make_run("broken-report")).status_code == 201
    service.wait_reports()
    with service.client() as client:
        report = client.get("/api/runs/broken-report").json()["report"]
        assert report["state"] == "failed"
        assert "node died" in report["message"]
        served = client.get("/runs/broken-report/report/")
        assert served.status_code == 404
        assert "node died" in served.json()["error"]
    assert [r.run_id for r in service.stored()] == ["broken-report"]


def test_healthz(service: Service) -> None:
    with service.client() as client:
        assert client.get("/healthz").json() == {"status": "ok"}


class _DownStore(ResultsStore):
    """A store whose database went away after the service started."""

    def list_runs(self, **_: Any) -> list[RunRecord]:
        raise ResultsStoreError("results store at test failed while listing runs: down")

    def list_summaries(self, **_: Any) -> list[RunSummary]:
        raise ResultsStoreError("results store at test failed while listing runs: down")


def test_healthz_and_reads_say_503_when_the_store_is_down(start_service: ServiceFactory,
                                                          tmp_path: Path) -> None:
    def open_down(url: str | None) -> ResultsStore:
        real = open_store(url)
        # A real store that opened fine, then fails every read: what a database that
        # went down after startup looks like to the service.
        real.__class__ = _DownStore
        return real

    service = start_service(f"sqlite:///{tmp_path / 'down.sqlite'}", open_results=open_down)
    with service.client() as client:
        health = client.get("/healthz")
        assert health.status_code == 503
        assert health.json()["status"] == "unavailable"
        runs = client.get("/api/runs")
        assert runs.status_code == 503
        assert "down" in runs.json()["error"]


def test_pending_reports_are_made_after_a_restart(tmp_path: Path,
                                                  store_url: str) -> None:  # noqa: F811
    layout = Layout(tmp_path / "data")
    layout.create()
    run = make_run("left-pending")
    layout.run_dir(run.run_id).mkdir()
    (layout.run_dir(run.run_id) / "run.json").write_text(json.dumps(run.to_json()))
    write_allure_results(layout.results_dir(run.run_id), [("test_a", "passed")])
    generator = RecordingGenerator()
    with open_store(store_url) as store:
        # What ingest leaves when the service stops before the worker gets to the run.
        store.add_run(run, report=pending_state())
        assert read_state(store, run.run_id)["state"] == "pending"
        worker = ReportWorker(layout, store, generator)
        worker.start()
        try:
            assert worker.wait_idle(30)
        finally:
            worker.stop()
        assert [call[0] for call in generator.calls] == ["left-pending"]
        assert read_state(store, run.run_id) == {"state": "ready", "message": None,
                                                 "problems": [],
                                                 "url": "/runs/left-pending/report/"}


def test_an_upload_brings_the_files_of_a_run_stored_without_them(service: Service,
                                                                 tmp_path: Path) -> None:
    run = make_run("stored-by-cli")
    with open_store(service.store_url) as store:
        store.add_run(run)  # as `harness store` does: a row, no files, no report
    with service.client() as client:
        assert client.get("/api/runs/stored-by-cli").json()["report"]["state"] == "none"
    answer = service.upload(tmp_path, run)
    assert answer.status_code == 200, answer.text
    assert answer.json()["created"] is False
    assert answer.json()["report"]["state"] in {"pending", "ready"}
    service.wait_reports()
    assert [call[0] for call in service.generator.calls] == ["stored-by-cli"]
    assert (service.data_dir / "runs" / "stored-by-cli" / "report" / "index.html").is_file()
    with service.client() as client:
        assert client.get("/api/runs/stored-by-cli").json()["report"]["state"] == "ready"
    assert tmp_leftovers(service.data_dir) == []


def _allure_available() -> str | None:
    try:
        import harness.report.allure  # noqa: F401, PLC0415
    except ImportError as exc:
        return f"harness.report.allure is not importable: {exc}"
    return allure_missing()


def test_real_allure_report_is_made_and_served(tmp_path: Path) -> None:
    skip_unless_present("allure", _allure_available())
    from harness.service.reports import allure_generator  # noqa: PLC0415

    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token=TOKEN,
                                     results_url=f"sqlite:///{tmp_path / 'r.sqlite'}",
                                     report_generator=allure_generator))
    run = make_run("allure-1", outcomes=[outcome("t.py::test_a"),
                                         outcome("t.py::test_b", "failed")])
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        answer = client.post("/api/runs", content=bundle_bytes(tmp_path, run),
                             headers={**GZIP, **AUTH})
        assert answer.status_code == 201, answer.text
        deadline = time.monotonic() + REPORT_DEADLINE_S
        state = "pending"
        while state == "pending" and time.monotonic() < deadline:
            time.sleep(0.5)
            state = client.get("/api/runs/allure-1").json()["report"]["state"]
        report = client.get("/api/runs/allure-1").json()["report"]
        assert state == "ready", report
        index = client.get("/runs/allure-1/report/")
        assert index.status_code == 200
        assert "<html" in index.text.lower()
    history = tmp_path / "data" / "history"
    assert list(history.rglob("*.jsonl")), "allure wrote no history file"
