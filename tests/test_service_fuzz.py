"""Every route of the results service, fuzzed: no 5xx, no status a route does not document.

The routes come from the app's own route table, so a route added later is fuzzed (or
this test fails until ``ROUTE_STATUSES`` documents it). Each route draws its path
parameters, query strings and (for uploads) bodies from strategies that mix hostile
values — control characters, "²", huge numbers, inf, raw bytes, broken gzip, run
records with NaN or the wrong types — with valid ones; a request made only of valid
values must succeed. The service is a real uvicorn server on loopback over SQLite and
over PostgreSQL, seeded with runs and reports; afterwards it is healthy and every
seeded run still reads back.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import tarfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from results_fixtures import GPU_BOX, KEY, _postgres_database, at, fig, make_run, outcome
from service_helpers import no_report
from starlette.routing import BaseRoute, Match, Route
from test_service import AUTH, GZIP, TOKEN

from harness.plugin.required import skip_unless_present
from harness.results.run_record import RunRecord
from harness.service.app import ROUTE_STATUSES, create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import make_bundle
from harness.service.dashboard import series_id
from harness.service.settings import ServiceSettings

EXAMPLES = 40
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])

SEEDED = [
    make_run("seed-main-1", started_at=at(1), outcomes=[outcome("t.py::test_a")],
             figures=[fig("decode_tps", 100.0)]),
    make_run("seed-main-2", started_at=at(2), outcomes=[outcome("t.py::test_a")],
             figures=[fig("decode_tps", 101.0)]),
    make_run("seed-main-3", started_at=at(3), outcomes=[outcome("t.py::test_a")],
             figures=[fig("decode_tps", 99.0)]),
    make_run("seed-pr-1", branch="pr/1", started_at=at(4),
             outcomes=[outcome("t.py::test_a", "failed", message="boom")],
             figures=[fig("decode_tps", 98.0)]),
    make_run("seed-gpu-1", started_at=at(5), hardware=GPU_BOX),
]
SEEDED_IDS = [run.run_id for run in SEEDED]
BRANCHES = ["main", "pr/1"]
HARDWARE = [SEEDED[0].hardware.identity, GPU_BOX.identity]


def seed_bundle(tmp: Path, run: RunRecord) -> bytes:
    """A bundle of ``run`` whose Allure results carry the plugin's nodeid labels."""
    work = tmp / f"bundle-{run.run_id}-{uuid.uuid4().hex[:8]}"
    results = work / "allure-results"
    results.mkdir(parents=True)
    (work / "run.json").write_text(json.dumps(run.to_json()))
    for index, test in enumerate(run.outcomes or [outcome("t.py::test_a")]):
        (results / f"r{index}-result.json").write_text(json.dumps({
            "uuid": f"r{index}-{run.run_id}", "name": test.test_id, "status": test.outcome,
            "stage": "finished", "start": 1, "stop": 2,
            "labels": [{"name": "nodeid", "value": test.test_id}]}))
    return make_bundle(work / "run.json", results, work / "bundle.tar.gz").read_bytes()


@dataclass
class Fuzzed:
    url: str
    tmp: Path
    #: The app's route table, to find the route a request reached (see ``reached_statuses``).
    routes: list[BaseRoute]

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=60)


@contextmanager
def _service(tmp: Path, results_url: str) -> Iterator[Fuzzed]:
    app = create_app(ServiceSettings(data_dir=tmp / "data", token=TOKEN,
                                     results_url=results_url, report_generator=no_report))
    with serve_in_thread(app) as url:
        with httpx.Client(base_url=url, timeout=60) as client:
            for run in SEEDED:
                answer = client.post("/api/runs", content=seed_bundle(tmp, run),
                                     headers={**GZIP, **AUTH})
                assert answer.status_code == 201, answer.text
        assert app.state.service.reports.wait_idle(60)
        yield Fuzzed(url, tmp, list(app.routes))


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def fuzzed(request: pytest.FixtureRequest,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    tmp = tmp_path_factory.mktemp(f"fuzz-{request.param}")
    with ExitStack() as stack:
        if request.param == "sqlite":
            results_url = f"sqlite:///{tmp / 'results.sqlite'}"
        else:
            base = os.environ.get("HARNESS_TEST_POSTGRES_URL")
            skip_unless_present("postgres", None if base else
                                "HARNESS_TEST_POSTGRES_URL is unset (.ci/run sets it)")
            assert base is not None
            results_url = stack.enter_context(contextmanager(_postgres_database)(base))
        yield stack.enter_context(_service(tmp, results_url))


# -- values ----------------------------------------------------------------------

#: Values no parameter should accept whole: controls, odd digits, overflow, non-finite.
HOSTILE_TEXT = st.one_of(
    st.text(max_size=40),
    st.sampled_from(["²", "٣", "\x00", "a\x00b", "1e999", "inf", "-inf", "nan", "NaN",
                     "-1", "0", "9" * 40, "1" * 5000, "0x10", "1_000", " 5", "5 ", "..",
                     "../../etc/passwd", "%00", "\r\nX-Injected: 1", "a" * 5000]),
)


@dataclass(frozen=True)
class Drawn:
    """A value for a request, and whether it is one the route must accept."""

    value: str
    valid: bool


def valid(values: st.SearchStrategy[str]) -> st.SearchStrategy[Drawn]:
    return values.map(lambda value: Drawn(value, True))


def hostile() -> st.SearchStrategy[Drawn]:
    return HOSTILE_TEXT.map(lambda value: Drawn(value, False))


def either(values: st.SearchStrategy[str]) -> st.SearchStrategy[Drawn]:
    return st.one_of(valid(values), hostile())


RUN_IDS = st.sampled_from(SEEDED_IDS)
LIMITS = st.integers(1, 1000).map(str)


def query(spec: dict[str, st.SearchStrategy[Drawn]],
          required: tuple[str, ...] = ()) -> st.SearchStrategy[dict[str, Drawn]]:
    """Some of the parameters in ``spec`` (always the required ones), plus stray ones."""
    optional = {name: strategy for name, strategy in spec.items() if name not in required}
    return st.fixed_dictionaries({name: spec[name] for name in required},
                                 optional=optional)


def encode_query(params: dict[str, Drawn], raw: bytes) -> str:
    parts = [f"{quote(name)}={quote(drawn.value, safe='')}" for name, drawn in params.items()]
    if raw:
        # Percent-escapes of arbitrary bytes: what a client that is not a browser sends.
        parts.append("x=" + "".join(f"%{byte:02X}" for byte in raw))
    return "&".join(parts)


RAW_BYTES = st.one_of(st.just(b""), st.binary(max_size=12),
                      st.sampled_from([b"\xc2\xb2", b"\xff\xfe", b"\x00", b"\xed\xa0\x80"]))


@dataclass(frozen=True)
class Request:
    path: str
    params: dict[str, Drawn]
    raw: bytes = b""
    path_valid: bool = True
    body: bytes | None = None
    body_valid: bool = True

    @property
    def all_valid(self) -> bool:
        return (self.path_valid and self.body_valid and not self.raw
                and all(drawn.valid for drawn in self.params.values()))

    def url(self) -> str:
        encoded = encode_query(self.params, self.raw)
        return f"{self.path}?{encoded}" if encoded else self.path


def path_part(drawn: Drawn) -> str:
    return quote(drawn.value, safe="") or "%20"


def simple(route_path: Callable[[str], str], run_id: st.SearchStrategy[Drawn],
           spec: dict[str, st.SearchStrategy[Drawn]],
           required: tuple[str, ...] = ()) -> st.SearchStrategy[Request]:
    @st.composite
    def draw(data: st.DrawFn) -> Request:
        drawn_id = data(run_id)
        return Request(route_path(path_part(drawn_id)), data(query(spec, required)),
                       data(RAW_BYTES), path_valid=drawn_id.valid)
    return draw()


NO_ID = st.just(Drawn("", True))


# -- bodies --------------------------------------------------------------------------

def _tar_gz(members: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb") as zipped, \
            tarfile.open(fileobj=zipped, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


#: Replaced by a 5000-digit integer literal once the body is written (json.dumps cannot
#: write one: Python refuses to turn it into a string).
BIG_INT = "__BIG_INT__"
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
              st.text(max_size=20), st.sampled_from([BIG_INT, float("inf"), "\x00"])),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner,
                                                                 max_size=3),
    max_leaves=8)


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def upload_bodies(data: st.DrawFn) -> Request:
    kind = data(st.sampled_from(["valid", "mutated", "raw", "gzip-junk", "deep", "no-run"]))
    run = make_run(f"fuzz-{uuid.uuid4().hex[:12]}", started_at=at(30),
                   outcomes=[outcome("t.py::test_a")], figures=[fig("decode_tps", 100.0)])
    if kind == "valid":
        return Request("/api/runs", {}, body=seed_bundle(FUZZ_TMP[0], run))
    if kind == "raw":
        return Request("/api/runs", {}, body=data(st.binary(max_size=300)), body_valid=False)
    if kind == "gzip-junk":
        return Request("/api/runs", {}, body=gzip.compress(data(st.binary(max_size=300))),
                       body_valid=False)
    results = {"allure-results/a-result.json": b'{"uuid": "a", "name": "a"}'}
    if kind == "deep":
        text = data(st.sampled_from([_deep(1000), _deep(100_000),
                                     '{"run_id": ' + "1" * 5000 + "}"]))
        members = {"run.json": text.encode(), **results}
        return Request("/api/runs", {}, body=_tar_gz(members), body_valid=False)
    if kind == "no-run":
        return Request("/api/runs", {}, body=_tar_gz(results), body_valid=False)
    body: dict[str, Any] = run.to_json()
    path = data(st.sampled_from([
        ("run_id",), ("branch",), ("build", "image_digest"), ("hardware", "vram_mib"),
        ("outcomes", 0, "test_id"), ("outcomes", 0, "outcome"), ("outcomes", 0, "message"),
        ("outcomes", 0, "duration_s"), ("figures", 0, "value"), ("figures", 0, "key",
                                                                 "n_prompt"),
        ("labels",), ("schema",)]))
    target: Any = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = data(JSON_VALUES)
    text = json.dumps(body, allow_nan=True).replace(f'"{BIG_INT}"', "1" * 5000)
    return Request("/api/runs", {}, body=_tar_gz({"run.json": text.encode(), **results}),
                   body_valid=False)


#: A bisect a stored run may carry (harness bisect --json).
VALID_BISECT: dict[str, Any] = {
    "good": "a" * 40, "bad": "b" * 40, "oracle": "script: true", "commits": 3,
    "reproduced": True, "first_bad": {"sha": "b" * 40, "subject": "s"},
    "candidates": [{"sha": "b" * 40, "subject": "s"}], "stopped": None,
    "probes": [{"commit": "b" * 40, "subject": "s", "verdict": "bad", "evidence": "exit 1",
                "build_key": "cpu-1", "build_s": 1.0, "judge_s": 0.5, "cache_hit": False}]}


@st.composite
def bisect_bodies(data: st.DrawFn) -> Request:
    """PUT /api/runs/{id}/bisect: a valid bisect, one with a field replaced by any JSON
    value, text that tries to close the object and add fields, or bytes."""
    run_id = data(either(RUN_IDS))
    path = f"/api/runs/{path_part(run_id)}/bisect"
    kind = data(st.sampled_from(["valid", "mutated", "escape", "raw"]))
    if kind == "valid":
        return Request(path, {}, body=json.dumps(VALID_BISECT).encode(),
                       path_valid=run_id.valid)
    if kind == "raw":
        return Request(path, {}, body=data(st.binary(max_size=300)), path_valid=run_id.valid,
                       body_valid=False)
    if kind == "escape":
        text = json.dumps(VALID_BISECT) + data(st.sampled_from([
            ', "branch": "other"', ', "ab": {}', '}, "x": {', ', "run_id": "seed-main-1"']))
        return Request(path, {}, body=text.encode(), path_valid=run_id.valid,
                       body_valid=False)
    body = json.loads(json.dumps(VALID_BISECT))
    field = data(st.sampled_from(["good", "commits", "reproduced", "first_bad", "probes",
                                  "oracle"]))
    body[field] = data(JSON_VALUES)
    return Request(path, {}, body=json.dumps(body, allow_nan=True).encode(),
                   path_valid=run_id.valid, body_valid=False)


#: Where upload bodies build their bundles (set by the upload test; hypothesis
#: strategies cannot take fixtures).
FUZZ_TMP: list[Path] = []


# -- routes ------------------------------------------------------------------------

LIST_SPEC = {"branch": either(st.sampled_from(BRANCHES)),
             "hardware": either(st.sampled_from(HARDWARE)), "limit": either(LIMITS)}
COMPARE_SPEC = {
    "base": either(st.sampled_from(["main", "seed-main-1"])),
    "head": either(st.sampled_from(["seed-pr-1"])),
    "window": either(st.integers(1, 1000).map(str)),
    "threshold": either(st.sampled_from(["0", "0.05", "0.5", "10"])),
    "z": either(st.sampled_from(["0", "3", "2.5"])),
    "min_runs": either(st.integers(2, 1000).map(str)),
    "format": either(st.sampled_from(["json", "markdown"])),
}

#: (method, routed path) -> requests to send and the statuses a valid one may get.
ROUTE_REQUESTS: dict[tuple[str, str], tuple[st.SearchStrategy[Request], frozenset[int]]] = {
    ("GET", "/api/runs"): (simple(lambda _: "/api/runs", NO_ID, LIST_SPEC),
                           frozenset({200})),
    ("GET", "/api/runs/{run_id}"): (
        simple(lambda rid: f"/api/runs/{rid}", either(RUN_IDS), {}), frozenset({200})),
    ("GET", "/api/runs/{run_id}/results"): (
        simple(lambda rid: f"/api/runs/{rid}/results", either(RUN_IDS),
               {"test": either(st.just("t.py::test_a"))}, required=("test",)),
        frozenset({200})),
    ("GET", "/api/compare"): (simple(lambda _: "/api/compare", NO_ID, COMPARE_SPEC,
                                     required=("base", "head")), frozenset({200})),
    ("GET", "/api/history"): (
        simple(lambda _: "/api/history", NO_ID,
               {"branch": either(st.sampled_from(BRANCHES)),
                "hardware": valid(st.just(HARDWARE[0])), "limit": either(LIMITS),
                "metric": either(st.sampled_from(["decode_tps", "load_s"])),
                "key": either(st.just(KEY.label()))},
               required=("branch", "hardware")), frozenset({200})),
    ("GET", "/dashboard"): (
        simple(lambda _: "/dashboard", NO_ID,
               {"branch": either(st.sampled_from(BRANCHES)),
                "hardware": either(st.sampled_from(HARDWARE)),
                "limit": either(st.integers(1, 200).map(str)),
                "fixture": either(st.sampled_from(["tiny-llama", "nothing"])),
                "metric": either(st.sampled_from(["all", "decode_tps", "kv_mib"])),
                "changed": either(st.sampled_from(["0", "1"])),
                "page": either(st.integers(1, 1_000_000).map(str))}), frozenset({200})),
    # Valid: a series the seeded runs of that branch and hardware have, so it is drawn.
    ("GET", "/dashboard/plot.svg"): (
        simple(lambda _: "/dashboard/plot.svg", NO_ID,
               {"branch": either(st.sampled_from(BRANCHES)),
                "hardware": either(st.just(HARDWARE[0])),
                "limit": either(st.integers(1, 200).map(str)),
                "series": either(st.just(series_id(KEY, "decode_tps"))),
                "v": either(st.text("0123456789abcdef-", max_size=40))},
               required=("branch", "hardware", "series")), frozenset({200})),
    ("GET", "/dashboard/releases"): (
        simple(lambda _: "/dashboard/releases", NO_ID,
               {"hardware": either(st.just(HARDWARE[0]))}), frozenset({200})),
    ("GET", "/runs/{run_id}/report"): (
        simple(lambda rid: f"/runs/{rid}/report", either(RUN_IDS), {}), frozenset({307})),
    ("GET", "/runs/{run_id}/report/{path:path}"): (
        st.builds(lambda rid, rel: Request(
            f"/runs/{path_part(rid)}/report/{quote(rel.value, safe='/')}", {},
            path_valid=rid.valid and rel.valid),
            either(RUN_IDS), either(st.just(""))), frozenset({200})),
    ("GET", "/healthz"): (simple(lambda _: "/healthz", NO_ID, {}), frozenset({200})),
    ("POST", "/api/runs"): (upload_bodies(), frozenset({201})),
    ("PUT", "/api/runs/{run_id}/bisect"): (bisect_bodies(), frozenset({200})),
}


def test_every_route_of_the_app_is_documented_and_fuzzed(tmp_path: Path) -> None:
    routes = _routes_of_a_real_app(tmp_path)
    assert set(routes) == set(ROUTE_STATUSES), "document every route in ROUTE_STATUSES"
    assert set(routes) == set(ROUTE_REQUESTS), "give every route a strategy here"


def _app_routes(tmp_path: Path) -> list[BaseRoute]:
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token=TOKEN,
                                     results_url=f"sqlite:///{tmp_path / 'r.sqlite'}",
                                     report_generator=no_report))
    app.state.service.store.close()
    return list(app.routes)


def _routes_of_a_real_app(tmp_path: Path) -> list[tuple[str, str]]:
    return sorted((method, route.path) for route in _app_routes(tmp_path)
                  if isinstance(route, Route)
                  for method in (route.methods or ()) if method != "HEAD")


def reached_statuses(routes: list[BaseRoute], method: str, path: str) -> frozenset[int]:
    """What the app may answer ``method path``, judged by the route the path reaches.

    A drawn run id of "." or ".." is a dot segment the client folds before it sends
    (".../report/." is ".../report"), so the request can reach another route than the one
    drawn, or none. Starlette's own matching decides, as it does in the server: the
    documented statuses of the route that takes the method there, 405 where only routes of
    other methods match the path, 404 where none does (the app redirects no slashes).
    """
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    other_method = False
    for candidate in routes:
        match, _ = candidate.matches(scope)
        if match is Match.FULL and isinstance(candidate, Route):
            return ROUTE_STATUSES[(method, candidate.path)]
        other_method = other_method or match is Match.PARTIAL
    return frozenset({405 if other_method else 404})


def test_a_folded_dot_segment_is_judged_by_the_route_it_reaches(tmp_path: Path) -> None:
    routes = _app_routes(tmp_path)
    assert reached_statuses(routes, "GET", "/runs/x/report") == \
        ROUTE_STATUSES[("GET", "/runs/{run_id}/report")]
    assert reached_statuses(routes, "PUT", "/api/runs/bisect") == {405}
    assert reached_statuses(routes, "GET", "/api/nothing/here") == {404}
    assert reached_statuses(routes, "GET", "/api/runs") == ROUTE_STATUSES[("GET", "/api/runs")]


def test_a_dot_segment_reaches_the_route_the_client_folds_it_into(fuzzed: Fuzzed) -> None:
    with fuzzed.client() as client:
        answer = client.get("/runs/seed-main-1/report/.", follow_redirects=False)
    assert answer.request.url.path == "/runs/seed-main-1/report"
    assert answer.status_code == 307
    assert 307 not in ROUTE_STATUSES[("GET", "/runs/{run_id}/report/{path:path}")]
    assert answer.status_code in reached_statuses(fuzzed.routes, "GET",
                                                  answer.request.url.path)


def _check(fuzzed: Fuzzed, route: tuple[str, str], request: Request) -> None:
    method, _ = route
    with fuzzed.client() as client:
        if method == "POST":
            answer = client.post(request.url(), content=request.body or b"",
                                 headers={**GZIP, **AUTH})
        elif method == "PUT":
            answer = client.put(request.url(), content=request.body or b"",
                                headers={"Content-Type": "application/json", **AUTH})
        else:
            answer = client.get(request.url(), follow_redirects=False)
    shown = f"{method} {request.url()[:300]} -> {answer.status_code} {answer.text[:300]}"
    assert answer.status_code < 500, shown
    statuses = reached_statuses(fuzzed.routes, method, answer.request.url.path)
    assert answer.status_code in statuses, f"undocumented status: {shown}"
    if request.all_valid:
        assert answer.status_code in ROUTE_REQUESTS[route][1], f"valid but refused: {shown}"
    assert len(answer.content) < 1 << 20, f"answer of {len(answer.content)} bytes: {shown}"


@pytest.mark.parametrize("route", sorted(ROUTE_REQUESTS), ids=lambda r: f"{r[0]} {r[1]}")
def test_route_fuzz_finds_no_5xx(fuzzed: Fuzzed, route: tuple[str, str]) -> None:
    FUZZ_TMP[:] = [fuzzed.tmp]

    @FUZZ
    @given(request=ROUTE_REQUESTS[route][0])
    def fuzz(request: Request) -> None:
        _check(fuzzed, route, request)

    fuzz()
    with fuzzed.client() as client:
        assert client.get("/healthz").status_code == 200
        for run_id in SEEDED_IDS:
            answer = client.get(f"/api/runs/{run_id}")
            assert answer.status_code == 200, answer.text
        listed = client.get("/api/runs", params={"limit": "1000"})
        assert listed.status_code == 200, listed.text
        assert set(SEEDED_IDS) <= {run["run_id"] for run in listed.json()["runs"]}

