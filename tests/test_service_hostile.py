"""The results service against what an attacker (or a broken runner) sends it.

Each case of issue 12 is reproduced against a real service on loopback — uvicorn in a
thread over SQLite and PostgreSQL, or a real ``harness serve`` process where the
command line, the access log or raw sockets are the point — and must now get a 4xx
or the documented behaviour, with the service healthy and every earlier run still
readable afterwards.
"""

from __future__ import annotations

import gzip
import io
import json
import logging
import os
import socket
import subprocess
import sys
import tarfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from results_fixtures import at, fig, make_run, outcome, store_url  # noqa: F401 - fixture
from service_helpers import free_port, tmp_leftovers, wait_healthy
from test_service import (  # noqa: F401 - start_service is a fixture
    AUTH,
    GZIP,
    TOKEN,
    RecordingGenerator,
    Service,
    ServiceFactory,
    bundle_bytes,
    start_service,
    write_allure_results,
)

from harness.results.store import ResultsStore, open_store
from harness.service.bundle import make_bundle

HARNESS = str(Path(sys.executable).with_name("harness"))
EARLIER = make_run("earlier-1", started_at=at(1), outcomes=[outcome("t.py::test_a")],
                   figures=[fig("decode_tps", 100.0)])


@pytest.fixture
def seeded(start_service: ServiceFactory, store_url: str) -> Service:  # noqa: F811
    service = start_service(store_url)
    answer = service.upload(service.data_dir.parent, EARLIER)
    assert answer.status_code == 201, answer.text
    return service


def assert_still_healthy(service: Service) -> None:
    """Health, the listing, the earlier run and its history all still answer."""
    with service.client() as client:
        assert client.get("/healthz").status_code == 200
        listed = client.get("/api/runs")
        assert listed.status_code == 200, listed.text
        assert "earlier-1" in {run["run_id"] for run in listed.json()["runs"]}
        assert client.get("/api/runs/earlier-1").status_code == 200
        history = client.get("/api/history", params={
            "branch": "main", "hardware": EARLIER.hardware.identity})
        assert history.status_code == 200, history.text


def upload_run_json(service: Service, tmp_path: Path, text: str) -> httpx.Response:
    """POST a bundle whose run.json is exactly ``text``."""
    work = tmp_path / f"raw-{uuid.uuid4().hex[:8]}"
    work.mkdir()
    (work / "run.json").write_text(text)
    results = write_allure_results(work / "allure-results", [("test_a", "passed")])
    bundle = make_bundle(work / "run.json", results, work / "bundle.tar.gz")
    with service.client() as client:
        return client.post("/api/runs", content=bundle.read_bytes(), headers={**GZIP, **AUTH})


def _body(run_id: str) -> dict[str, Any]:
    return make_run(run_id, started_at=at(10), outcomes=[outcome("t.py::test_a")],
                    figures=[fig("decode_tps", 100.0)]).to_json()


# -- store poisoning and wrong types: 422 naming the field, on both stores -----------

NON_FINITE = ["NaN", "Infinity", "-Infinity"]
POISON_PLACES = [
    (("build", "image_digest"), "$.build.image_digest"),
    (("hardware", "vram_mib"), "$.hardware.vram_mib"),
    (("outcomes", 0, "duration_s"), "$.outcomes[0].duration_s"),
    (("figures", 0, "value"), "$.figures[0].value"),
]


def _set(body: dict[str, Any], path: tuple[str | int, ...], value: Any) -> None:
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@pytest.mark.parametrize("constant", NON_FINITE)
@pytest.mark.parametrize(("place", "field"), POISON_PLACES,
                         ids=[field for _, field in POISON_PLACES])
def test_non_finite_numbers_are_refused_and_poison_nothing(
        seeded: Service, tmp_path: Path, constant: str, place: tuple[str | int, ...],
        field: str) -> None:
    body = _body(f"poison-{uuid.uuid4().hex[:8]}")
    marker = "__POISON__"
    _set(body, place, marker)
    # json.dumps(float("inf")) writes the bare constant; so does this.
    text = json.dumps(body).replace(f'"{marker}"', constant)
    answer = upload_run_json(seeded, tmp_path, text)
    assert answer.status_code == 422, answer.text
    assert field in answer.json()["error"] or "non-finite" in answer.json()["error"]
    assert_still_healthy(seeded)


WRONG_TYPES = [
    (("outcomes", 0, "test_id"), ["a", "b"], "$.outcomes[0].test_id"),
    (("outcomes", 0, "message"), {"a": 1}, "$.outcomes[0].message"),
    (("outcomes", 0, "outcome"), None, "$.outcomes[0].outcome"),
    (("figures", 0, "key", "n_prompt"), "128", "$.figures[0].key.n_prompt"),
    (("outcomes", 0, "duration_s"), True, "$.outcomes[0].duration_s"),
    (("branch",), "ma\x00in", "$.branch"),
]


@pytest.mark.parametrize(("place", "value", "field"), WRONG_TYPES,
                         ids=[field for _, _, field in WRONG_TYPES])
def test_a_field_of_the_wrong_type_is_a_422_naming_it_on_both_stores(
        seeded: Service, tmp_path: Path, place: tuple[str | int, ...], value: Any,
        field: str) -> None:
    body = _body(f"typed-{uuid.uuid4().hex[:8]}")
    _set(body, place, value)
    answer = upload_run_json(seeded, tmp_path, json.dumps(body))
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert field in error
    assert "database" not in error
    assert str(seeded.data_dir) not in error
    assert_still_healthy(seeded)


@pytest.mark.parametrize("text", [
    '{"run_id": ' + "1" * 5000 + "}",
    "[" * 1000 + "]" * 1000,
    '{"a": ' * 1000 + "1" + "}" * 1000,
], ids=["5000-digit-integer", "nested-1000-lists", "nested-1000-objects"])
def test_huge_integers_and_deep_nesting_are_422(seeded: Service, tmp_path: Path,
                                                 text: str) -> None:
    answer = upload_run_json(seeded, tmp_path, text)
    assert answer.status_code == 422, answer.text
    assert len(answer.content) < 4096
    assert_still_healthy(seeded)


def test_a_results_file_name_that_is_not_utf8_is_refused(seeded: Service,
                                                         tmp_path: Path) -> None:
    out = io.BytesIO()
    run_json = json.dumps(_body("latin-1")).encode()
    with gzip.GzipFile(fileobj=out, mode="wb") as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.GNU_FORMAT,
                         encoding="latin-1") as tar:
        for name, data in [("run.json", run_json),
                           ("allure-results/caf\xe9-result.json", b"{}")]:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with seeded.client() as client:
        answer = client.post("/api/runs", content=out.getvalue(), headers={**GZIP, **AUTH})
    assert answer.status_code == 422, answer.text
    assert "UTF-8" in answer.json()["error"]
    assert_still_healthy(seeded)


# -- query strings and paths: 400/404, never 500 --------------------------------------

@pytest.mark.parametrize(("path", "params", "status"), [
    ("/api/runs", "limit=%C2%B2", 400),
    ("/api/runs", "limit=99999999999999999999999", 400),
    ("/api/runs", "branch=ma%00in", 400),
    ("/api/history", "branch=main&hardware=x&limit=%C2%B2", 400),
    ("/api/compare", "base=main&head=earlier-1&window=" + "9" * 30, 400),
    ("/api/compare", "base=main&head=earlier-1&window=99999999999", 400),
    ("/api/compare", "base=main&head=earlier-1&threshold=inf", 400),
    ("/api/compare", "base=main&head=earlier-1&threshold=nan", 400),
    ("/api/compare", "base=main&head=earlier-1&z=1e999", 400),
    ("/runs/earlier-1/report/%00", "", 400),
    ("/runs/earlier-1/report/" + "a" * 5000, "", 400),
    ("/runs/earlier-1/report/" + "/".join(["b" * 200] * 4), "", 404),
    ("/runs/..%2F..%2Fetc/report/", "", 404),
], ids=lambda value: str(value)[:40])
def test_bad_query_strings_and_paths_are_4xx(seeded: Service, path: str, params: str,
                                             status: int) -> None:
    seeded.wait_reports()
    with seeded.client() as client:
        answer = client.get(f"{path}?{params}" if params else path)
    assert answer.status_code == status, answer.text
    assert "request_id" not in answer.text
    assert_still_healthy(seeded)


class _BrokenStore:
    """A store whose reads fail with an error nobody expected (a bug, not an outage)."""

    def __init__(self, inner: ResultsStore) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name in ("list_runs", "list_summaries"):
            def broken(**_: Any) -> Any:
                raise RuntimeError("secret detail /var/lib/private-path")
            return broken
        return getattr(self._inner, name)


def test_an_unexpected_error_is_a_500_with_a_request_id_and_no_detail(
        start_service: ServiceFactory, tmp_path: Path,  # noqa: F811
        caplog: pytest.LogCaptureFixture) -> None:
    service = start_service(f"sqlite:///{tmp_path / 'r.sqlite'}",
                            open_results=lambda url: _BrokenStore(open_store(url)))
    with caplog.at_level(logging.ERROR, logger="harness.service"), service.client() as client:
        answer = client.get("/api/runs")
    assert answer.status_code == 500
    body = answer.json()
    request_id = body["request_id"]
    assert answer.headers["x-request-id"] == request_id
    assert "secret" not in answer.text
    assert "RuntimeError" not in answer.text
    logged = [r for r in caplog.records if request_id in r.getMessage()]
    assert logged, "the failure is logged under the request id"
    assert logged[0].exc_info is not None, "with its traceback"
    assert "secret detail" in caplog.text


# -- attachments: no script from the service's own origin ------------------------------

class _ReportWithAttachments(RecordingGenerator):
    def __call__(self, results_dir: Path, output_dir: Path, **kwargs: Any) -> Any:
        problems = super().__call__(results_dir, output_dir, **kwargs)
        attachments = output_dir / "data" / "attachments"
        attachments.mkdir(parents=True)
        (attachments / "page.html").write_text("<script>alert(document.cookie)</script>")
        (attachments / "logo.svg").write_text(
            '<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>')
        (attachments / "log.txt").write_text("plain text")
        return problems


def test_attachments_are_sandboxed_and_active_types_are_downloads(
        start_service: ServiceFactory, tmp_path: Path) -> None:  # noqa: F811
    service = start_service(f"sqlite:///{tmp_path / 'r.sqlite'}",
                            generator=_ReportWithAttachments())
    assert service.upload(tmp_path, EARLIER).status_code == 201
    service.wait_reports()
    with service.client() as client:
        index = client.get("/runs/earlier-1/report/")
        html = client.get("/runs/earlier-1/report/data/attachments/page.html")
        svg = client.get("/runs/earlier-1/report/data/attachments/logo.svg")
        text = client.get("/runs/earlier-1/report/data/attachments/log.txt")
        api = client.get("/api/runs")
    assert index.status_code == 200
    assert index.headers["x-content-type-options"] == "nosniff"
    assert "content-security-policy" not in index.headers  # the report app must run
    for active in (html, svg):
        assert active.status_code == 200
        assert active.headers["content-security-policy"] == "sandbox"
        assert active.headers["content-disposition"] == "attachment"
        assert active.headers["x-content-type-options"] == "nosniff"
    assert text.headers["content-security-policy"] == "sandbox"
    assert "content-disposition" not in text.headers
    assert api.headers["x-content-type-options"] == "nosniff"


# -- a real `harness serve`: idle timeouts, access log ---------------------------------

IDLE_S = 1.5


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """A ``harness serve`` process with a short idle timeout: (url, data dir, its log)."""
    port = free_port()
    data = tmp_path / "data"
    log = tmp_path / "serve.log"
    env = {**os.environ, "HARNESS_SERVICE_TOKEN": TOKEN}
    with log.open("wb") as sink:
        server = subprocess.Popen(
            [HARNESS, "serve", "--port", str(port), "--data-dir", str(data),
             "--results-url", f"sqlite:///{tmp_path / 'r.sqlite'}",
             "--idle-timeout-s", str(IDLE_S)],
            stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, server, log)
        yield url, data, log
    finally:
        server.terminate()
        server.wait(30)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    return sock


def _read_until_closed(sock: socket.socket, limit_s: float) -> tuple[bytes, float]:
    started = time.monotonic()
    sock.settimeout(limit_s)
    received = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return received, time.monotonic() - started
        received += chunk


def _stalled_upload(sock: socket.socket, declared: int = 1_000_000) -> None:
    sock.sendall(b"POST /api/runs HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Type: application/gzip\r\n"
                 + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {declared}\r\n\r\n"
                 .encode() + b"\x1f\x8b" + b"\0" * 1000)


def test_a_body_that_stops_sending_is_dropped_after_the_idle_time(
        served: tuple[str, Path, Path]) -> None:
    url, data, _ = served
    sockets = [_connect(url) for _ in range(40)]
    for sock in sockets:
        _stalled_upload(sock)
    time.sleep(0.3)
    assert tmp_leftovers(data), "the stalled uploads are being received"
    held = []
    for sock in sockets:
        received, waited = _read_until_closed(sock, IDLE_S * 10)
        held.append(waited)
        assert received.startswith(b"HTTP/1.1 408"), received[:200]
        sock.close()
    assert max(held) < IDLE_S * 5
    deadline = time.monotonic() + 10
    while tmp_leftovers(data) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not tmp_leftovers(data), "every stalled upload's temp file is removed"
    assert httpx.get(f"{url}/healthz").status_code == 200


@pytest.mark.parametrize("sent", [b"", b"GET /api/runs HTTP/1.1\r\nHost: x\r\n"],
                         ids=["nothing", "half-a-header"])
def test_headers_that_never_finish_are_dropped_after_the_idle_time(
        served: tuple[str, Path, Path], sent: bytes) -> None:
    url, _, _ = served
    sock = _connect(url)
    sock.sendall(sent)
    received, waited = _read_until_closed(sock, IDLE_S * 10)
    sock.close()
    assert received.startswith(b"HTTP/1.1 408"), received[:200]
    assert IDLE_S * 0.8 < waited < IDLE_S * 5


def test_a_slow_but_steady_upload_is_not_dropped(served: tuple[str, Path, Path],
                                                 tmp_path: Path) -> None:
    url, _, _ = served
    bundle = bundle_bytes(tmp_path, make_run("slow-1"))
    sock = _connect(url)
    sock.sendall(b"POST /api/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/gzip\r\n"
                 + f"Authorization: Bearer {TOKEN}\r\nContent-Length: {len(bundle)}\r\n"
                 "Connection: close\r\n\r\n".encode())
    # Each pause is under the idle time, the whole upload well over it.
    pieces = 6
    step = -(-len(bundle) // pieces)
    for start in range(0, len(bundle), step):
        time.sleep(IDLE_S * 0.6)
        sock.sendall(bundle[start:start + step])
    received, _ = _read_until_closed(sock, 30)
    sock.close()
    assert received.startswith(b"HTTP/1.1 201"), received[:300]


def test_the_access_log_leaves_out_query_strings(served: tuple[str, Path, Path]) -> None:
    url, _, log = served
    secret = "tok-" + uuid.uuid4().hex
    answer = httpx.get(f"{url}/api/runs", params={"token": secret, "limit": "5"})
    assert answer.status_code == 200
    request_id = answer.headers["x-request-id"]
    deadline = time.monotonic() + 10
    while request_id not in log.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    text = log.read_text()
    line = next(line for line in text.splitlines() if request_id in line)
    assert "GET '/api/runs' 200" in line
    assert secret not in text

