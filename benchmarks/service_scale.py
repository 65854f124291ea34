"""How fast the results service answers its read endpoints with many stored runs (issue 24).

    .venv/bin/python benchmarks/service_scale.py [--runs 10000] [--url sqlite|postgres]
        [--store PATH] [--repeat 5] [--profile NAME]

Fills a fresh store with ``--runs`` runs the size of the main job's (100 test outcomes,
402 figures over 30 figure keys and 6 metrics, a decode prediction on each decode
figure), spread over 4 hardware, ``main`` and release branches and short-lived pull
request branches, each with a ready report. Then it builds the service app in this
process and asks each read endpoint through Starlette's TestClient: the first answer
(cold) and the median of ``--repeat`` more (warm), in milliseconds, with the answer's
size. Target: every endpoint within 1 s at 10,000 runs.

The runs go in as the rows :meth:`ResultsStore.add_run` writes (the store's own
``store_rows`` functions, many runs to a transaction): the first run goes through
``add_run`` itself and the benchmark checks that the bulk rows read back as equal
records. Checking each run against the schema on the way in would take most of the
fill, and every run is built by the same code as that first one.

``--url postgres`` makes a throwaway database on the server ``$HARNESS_TEST_POSTGRES_URL``
names (as the store tests do) and drops it after. ``--store PATH`` keeps a SQLite store
at PATH and, when it already holds ``--runs`` runs, times it without filling again.
``--profile NAME`` prints where one warm request of that endpoint spends its time.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import pstats
import random
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anyio.to_thread
import httpx
import psycopg
from sqlalchemy import func, select
from sqlalchemy.engine import make_url

with warnings.catch_warnings():
    # Starlette asks for httpx2 under its TestClient; httpx (what the venv has) still works.
    warnings.simplefilter("ignore")
    from starlette.testclient import TestClient

import main_job_record
from main_job_record import FIGURES, HARDWARE, OUTCOMES, figure_keys
from throwaway_postgres import postgres_database

from harness.results.run_record import (
    Hardware,
    RunRecord,
)
from harness.results.store import open_store
from harness.results.store_backends import create_store_engine, engine_url
from harness.results.store_rows import (
    ReportState,
    figure_row,
    outcome_row,
    report_row,
    run_row,
)
from harness.results.store_tables import figures, outcomes, reports, runs
from harness.service.app import create_app
from harness.service.settings import ServiceSettings

#: Runs written per transaction while filling.
BATCH = 100
TARGET_MS = 1000.0

def main_job_run(index: int, branch: str, hardware: Hardware, rng: random.Random) -> RunRecord:
    """Run number ``index`` (later is newer) of the main job on ``hardware``."""
    minute = index * 7
    started = (f"2026-{1 + minute // 43200 % 12:02d}-{1 + minute // 1440 % 28:02d}T"
               f"{minute // 60 % 24:02d}:{minute % 60:02d}:00+00:00")
    return main_job_record.main_job_run(f"run-{index:06d}-{rng.getrandbits(32):08x}",
                                        branch=branch, hardware=hardware, started=started,
                                        rng=rng)


def run_plan(count: int, seed: int = 1) -> Iterator[tuple[int, str, Hardware]]:
    """Half the runs on main, a fifth on release branches, the rest on pull requests
    of a few runs each; every branch on each of the 4 hardware in turn."""
    rng = random.Random(seed)
    for index in range(count):
        roll = rng.random()
        if roll < 0.5:
            branch = "main"
        elif roll < 0.7:
            branch = f"release-{index // 1000}"
        else:
            branch = f"pr-{index // 8}"
        yield index, branch, HARDWARE[index % len(HARDWARE)]


def fill(url: str, count: int) -> float:
    """Store ``count`` runs at ``url``; the seconds it took."""
    start = time.monotonic()
    rng = random.Random(7)
    plan = iter(run_plan(count))
    with open_store(url) as store:
        index, branch, hardware = next(plan)
        first = main_job_run(index, branch, hardware, rng)
        store.add_run(first, report=ReportState("ready", queued_ns=1))
    engine = create_store_engine(engine_url(url))
    written: list[RunRecord] = []
    try:
        while True:
            batch = [main_job_run(i, b, h, rng) for i, b, h in _take(plan, BATCH)]
            if not batch:
                break
            written.extend(batch[:1])
            with engine.begin() as conn:
                conn.execute(runs.insert(), [run_row(r) for r in batch])
                conn.execute(outcomes.insert(), [
                    outcome_row(r.run_id, i, o) for r in batch for i, o in enumerate(r.outcomes)])
                conn.execute(figures.insert(), [
                    figure_row(r, i, f) for r in batch for i, f in enumerate(r.figures)])
                conn.execute(reports.insert(), [
                    report_row(r.run_id, ReportState("ready", queued_ns=1)) for r in batch])
            done = len(written) * BATCH
            if done % 1000 == 0:
                print(f"  {done} runs stored, {time.monotonic() - start:.0f} s", flush=True)
    finally:
        engine.dispose()
    if url.startswith("postgresql"):
        _analyze(url)
    with open_store(url) as store:
        for expected in [first, *written[:3]]:
            if store.get_run(expected.run_id) != expected:
                raise SystemExit(f"bulk-written run {expected.run_id} does not read back as "
                                 "written; the benchmark's rows are not the store's")
    return time.monotonic() - start


def _analyze(url: str) -> None:
    """PostgreSQL plans by its statistics: give it those a long-lived store would have."""
    plain = make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")


def _take(items: Iterator[tuple[int, str, Hardware]],
          n: int) -> list[tuple[int, str, Hardware]]:
    return [item for _, item in zip(range(n), items, strict=False)]


def stored_runs(url: str) -> int:
    engine = create_store_engine(engine_url(url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(runs)).scalar() or 0)
    finally:
        engine.dispose()


@dataclass
class Timing:
    name: str
    path: str
    cold_ms: float
    warm_ms: float
    status: int
    size: int


def endpoints(url: str) -> list[tuple[str, str]]:
    """(name, path) of each request to time, its run ids and branches read from the store."""
    with open_store(url) as store:
        newest = store.list_runs(branch="main", hardware=HARDWARE[1].identity, limit=1)
        pr = store.list_runs(limit=200)
    head = newest[0].run_id
    identity = HARDWARE[1].identity
    pr_branch = next((r.branch for r in pr if r.branch.startswith("pr-")), "main")
    key = figure_keys("cuda", HARDWARE[1].gpu or "none")[3]
    return [
        ("runs", "/api/runs"),
        ("runs branch", f"/api/runs?branch={pr_branch}"),
        ("runs hardware", f"/api/runs?hardware={identity}"),
        ("runs main+hw", f"/api/runs?branch=main&hardware={identity}"),
        ("runs limit=1000", "/api/runs?limit=1000"),
        ("run", f"/api/runs/{head}"),
        ("history (default: 60 runs)", f"/api/history?branch=main&hardware={identity}"),
        ("history limit=1000", f"/api/history?branch=main&hardware={identity}&limit=1000"),
        ("history key+metric", f"/api/history?branch=main&hardware={identity}"
                               f"&metric=decode_tps&key={quote(key.label(), safe='')}"),
        ("history limit=60", f"/api/history?branch=main&hardware={identity}&limit=60"),
        ("compare main", f"/api/compare?base=main&head={head}"),
        ("compare latest md", f"/api/compare?base=latest&head={head}&format=markdown"),
        ("dashboard index", "/dashboard"),
    ]


def time_endpoints(client: TestClient, paths: Sequence[tuple[str, str]],
                   repeat: int) -> list[Timing]:
    found = []
    for name, path in paths:
        start = time.perf_counter()
        answer = client.get(path)
        cold = (time.perf_counter() - start) * 1000
        warm = []
        for _ in range(repeat):
            start = time.perf_counter()
            client.get(path)
            warm.append((time.perf_counter() - start) * 1000)
        found.append(Timing(name, path, cold, statistics.median(warm), answer.status_code,
                            len(answer.content)))
    return found


def profile(app: Any, path: str) -> None:
    """Where one warm request of ``path`` spends its time, its handler run on this thread.

    The service runs its store calls in a thread pool, which cProfile does not follow, so
    here they run inline on the profiled thread instead.
    """
    async def inline(call: Any, *args: Any, **kwargs: Any) -> Any:
        return call(*args, **kwargs)

    async def get() -> None:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://scale") as client:
            (await client.get(path)).raise_for_status()

    # Starlette's run_in_threadpool hands its call to anyio's, looked up at each call.
    anyio.to_thread.run_sync = inline  # type: ignore[assignment]
    asyncio.run(get())
    profiler = cProfile.Profile()
    profiler.enable()
    asyncio.run(get())
    profiler.disable()
    stats = pstats.Stats(profiler, stream=sys.stdout)
    stats.sort_stats("cumulative").print_stats(30)
    stats.sort_stats("tottime").print_stats(15)


def no_report(results_dir: Path, output_dir: Path, *, history_path: Path,
              report_name: str) -> list[str]:
    return []


@contextmanager
def store_url(kind: str, path: str | None) -> Iterator[str]:
    """A URL for an empty (or, with ``path``, a kept) store of the kind asked for."""
    if kind == "sqlite":
        if path is not None:
            yield f"sqlite:///{Path(path).resolve()}"
            return
        with tempfile.TemporaryDirectory(prefix="service-scale-") as folder:
            yield f"sqlite:///{folder}/results.sqlite"
        return
    with postgres_database("service_scale", "--url postgres") as url:
        yield url


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10000)
    parser.add_argument("--url", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--store", default=None, help="keep the SQLite store at this path")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--profile", default=None, help="an endpoint name from the table")
    args = parser.parse_args()
    if args.store is not None and args.url != "sqlite":
        parser.error("--store is for --url sqlite")

    with ExitStack() as stack:
        url = stack.enter_context(store_url(args.url, args.store))
        have = stored_runs(url) if args.store and Path(args.store).exists() else 0
        if have == 0:
            print(f"filling a {args.url} store with {args.runs} main-job runs "
                  f"({FIGURES} figures, {OUTCOMES} outcomes each)", flush=True)
            print(f"filled in {fill(url, args.runs):.0f} s")
        elif have != args.runs:
            raise SystemExit(f"{args.store} holds {have} runs, not {args.runs}; remove it")
        paths = endpoints(url)
        data = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="scale-data-")))
        app = create_app(ServiceSettings(data_dir=data, token="t" * 32, results_url=url,
                                         report_generator=no_report))
        if args.profile is not None:
            profile(app, dict(paths)[args.profile])
            return
        client = stack.enter_context(TestClient(app))
        timings = time_endpoints(client, paths, args.repeat)

    print(f"\n{args.runs} runs, {args.url}; cold = first answer, warm = median of "
          f"{args.repeat}; target {TARGET_MS:.0f} ms")
    print(f"{'endpoint':<20} {'status':>6} {'cold ms':>9} {'warm ms':>9} {'bytes':>10}")
    for t in timings:
        mark = "" if max(t.cold_ms, t.warm_ms) <= TARGET_MS else "  over"
        print(f"{t.name:<20} {t.status:>6} {t.cold_ms:>9.0f} {t.warm_ms:>9.0f} "
              f"{t.size:>10}{mark}")


if __name__ == "__main__":
    main()
