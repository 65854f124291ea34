"""How fast the dashboard answers with a main job's history stored (issue 24).

    .venv/bin/python benchmarks/dashboard_speed.py [--nights 60] [--wide-keys 4000]
        [--index-runs 10000] [--repeat 5]

Three cases, each on a fresh SQLite store in a temporary folder, served by the service
app on a real loopback server in this process (as the tests serve it), read with httpx:

- ``branch``: ``--nights`` nights of the main job's run record (30 figure keys, 6
  metrics, 402 figures, 100 test outcomes, a decode prediction on each decode figure)
  on one branch: its first page, then every page and every plot the pages show;
- ``wide``: one run with ``--wide-keys`` figure keys, each with the 6 metrics: its first
  page and that page's plots, one fixture's decode speeds, and "changed only";
- ``index``: ``--index-runs`` runs over ``main``, release and pull-request branches on
  4 hardware: the index's first page. The index reads only the ``runs`` table, so these
  runs carry one outcome and no figures, which keeps the fill to half a minute.

Cold is the first answer of a service just started over the store (nothing cached: the
page reads and judges the runs, a plot is drawn); warm is the median of ``--repeat``
more of the same requests. Plots are fetched one after another, as a browser on one
connection would, and summed. Times in milliseconds, sizes in bytes. Targets: the branch
page within 3 s cold and 1 s warm, the index within 1 s; each printed as PASS or FAIL,
and the exit status is 1 when one is missed.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path

import httpx
import main_job_record
from main_job_record import BASE, HARDWARE, METRICS

from harness.results.run_record import (
    BuildRef,
    Figure,
    FigureKey,
    Outcome,
    RunRecord,
    TestOutcome,
)
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.settings import ServiceSettings

BRANCH = "main"
BUILD = BuildRef(backend="cpu", version="version: 5000 (abcdef12)", source_digest="0" * 64,
                 build_key="cpu-0123456789ab")
IMG = re.compile(r'<img src="([^"]+)"')
NEXT = re.compile(r'<a href="([^"]+)" rel="next">')
COLD_TARGET_MS, WARM_TARGET_MS, INDEX_TARGET_MS = 3000.0, 1000.0, 1000.0


def started(minute: int) -> str:
    day, rest = divmod(minute, 1440)
    return f"2026-{1 + day // 28:02d}-{1 + day % 28:02d}T{rest // 60:02d}:{rest % 60:02d}:00+00:00"


def main_job_run(night: int, rng: random.Random) -> RunRecord:
    """Night ``night`` of the main job on the CPU runner."""
    return main_job_record.main_job_run(f"night-{night:04d}", branch=BRANCH,
                                        hardware=HARDWARE[0],
                                        started=started(night * 1440 + 120), rng=rng,
                                        labels={"job": "main"})


def wide_run(keys: int, rng: random.Random) -> RunRecord:
    """One run with ``keys`` figure keys, each measured on every metric."""
    figures = tuple(Figure(test_id=f"suites/test_wide.py::test_key[{i}]",
                           key=FigureKey(fixture=f"fixture-{i % 40}", backend="cpu",
                                         gpu="none", n_gpu_layers="0", cache_type_k="f16",
                                         cache_type_v="f16", flash_attn="off", offload="",
                                         n_prompt=i + 1, n_gen=64),
                           metric=metric, value=round(BASE[metric] * rng.gauss(1.0, 0.03), 4))
                    for i in range(keys) for metric in METRICS)
    when = started(0)
    return RunRecord(run_id="wide", branch="wide", commit="f" * 40, started_at=when,
                     finished_at=when, hardware=HARDWARE[0], build=BUILD,
                     harness_version="0.1.0", outcomes=(), figures=figures, labels={})


def index_runs(count: int) -> Iterator[RunRecord]:
    rng = random.Random(3)
    for index in range(count):
        roll = rng.random()
        branch = ("main" if roll < 0.5 else f"release-{index // 1000}" if roll < 0.7
                  else f"pr-{index // 8}")
        when = started(index * 7)
        yield RunRecord(run_id=f"run-{index:06d}", branch=branch, commit=f"{index:040x}",
                        started_at=when, finished_at=when,
                        hardware=HARDWARE[index % len(HARDWARE)], build=BUILD,
                        harness_version="0.1.0",
                        outcomes=(TestOutcome("t.py::test_a", Outcome.PASSED, 1.0),),
                        figures=(), labels={})


@dataclass
class Timed:
    """One request (or a set of them) timed cold and warm."""

    name: str
    cold_ms: float
    warm_ms: float
    size: int
    count: int = 1
    targets: dict[str, bool] = field(default_factory=dict)

    def line(self) -> str:
        what = f"{self.count} requests, " if self.count > 1 else ""
        said = "".join(f"  {t}: {'PASS' if ok else 'FAIL'}" for t, ok in self.targets.items())
        return (f"  {self.name:<34} cold {self.cold_ms:9.1f} ms  warm {self.warm_ms:8.1f} ms"
                f"  {what}{self.size:>10,} bytes{said}")


@contextmanager
def served(folder: Path) -> Iterator[httpx.Client]:
    """A service just started over the store in ``folder``: nothing cached yet."""
    app = create_app(ServiceSettings(data_dir=folder / f"data-{time.monotonic_ns()}",
                                     token="b" * 32,
                                     results_url=f"sqlite:///{folder / 'results.sqlite'}",
                                     report_generator=lambda *a, **k: []))
    with serve_in_thread(app) as base, httpx.Client(base_url=base, timeout=300) as client:
        yield client


def fetch(client: httpx.Client, url: str) -> httpx.Response:
    answer = client.get(url)
    if answer.status_code != 200:
        raise SystemExit(f"GET {url} answered {answer.status_code}: {answer.text[:300]}")
    return answer


def timed(ask: Callable[[], int]) -> tuple[float, int]:
    start = time.perf_counter()
    size = ask()
    return (time.perf_counter() - start) * 1000, size


def measure(name: str, ask: Callable[[], int], repeat: int, count: int = 1) -> Timed:
    cold, size = timed(ask)
    warm = statistics.median(timed(ask)[0] for _ in range(repeat))
    return Timed(name, cold, warm, size, count)


def plots_of(client: httpx.Client, url: str) -> list[str]:
    return [unescape(src) for src in IMG.findall(fetch(client, url).text)]


def get_all(client: httpx.Client, urls: list[str]) -> Callable[[], int]:
    return lambda: sum(len(fetch(client, url).content) for url in urls)


def branch_case(folder: Path, nights: int, repeat: int) -> list[Timed]:
    rng = random.Random(1)
    start = time.monotonic()
    with open_store(f"sqlite:///{folder / 'results.sqlite'}") as store:
        for night in range(nights):
            store.add_run(main_job_run(night, rng))
    print(f"branch: {nights} nights stored in {time.monotonic() - start:.1f} s", flush=True)
    first = f"/dashboard?branch={BRANCH}&hardware={HARDWARE[0].identity}"
    # As a browser opens it: the first page, then the plots it shows.
    with served(folder) as client:
        page = measure("branch page 1", lambda: len(fetch(client, first).content), repeat)
        page.targets = {"cold <= 3 s": page.cold_ms <= COLD_TARGET_MS,
                        "warm <= 1 s": page.warm_ms <= WARM_TARGET_MS}
        own = plots_of(client, first)
        page_plots = measure("its plots", get_all(client, own), repeat, len(own))
    # Everything the branch has, on a service just started again.
    with served(folder) as client:
        pages = [first]
        while (found := NEXT.search(fetch(client, pages[-1]).text)) is not None:
            pages.append(unescape(found.group(1)))
        every = [p for url in pages for p in plots_of(client, url)]
        plots = measure("every plot of every page", get_all(client, every), repeat,
                        len(every))
    with served(folder) as client:
        rest = measure("every page", get_all(client, pages), repeat, len(pages))
    return [page, page_plots, rest, plots]


def wide_case(folder: Path, keys: int, repeat: int) -> list[Timed]:
    start = time.monotonic()
    with open_store(f"sqlite:///{folder / 'results.sqlite'}") as store:
        store.add_run(wide_run(keys, random.Random(2)))
    print(f"wide: one run of {keys} keys x {len(METRICS)} metrics stored in "
          f"{time.monotonic() - start:.1f} s", flush=True)
    base = f"/dashboard?branch=wide&hardware={HARDWARE[0].identity}"
    with served(folder) as client:
        page = measure("wide page 1", lambda: len(fetch(client, base).content), repeat)
        page.targets = {"cold <= 3 s": page.cold_ms <= COLD_TARGET_MS,
                        "warm <= 1 s": page.warm_ms <= WARM_TARGET_MS}
        own = plots_of(client, base)
        plots = measure("its plots", get_all(client, own), repeat, len(own))
        one = f"{base}&fixture=fixture-7&metric=decode_tps"
        filtered = measure("one fixture's decode_tps", lambda: len(fetch(client, one).content),
                           repeat)
        changed = measure("changed only", lambda: len(fetch(client, f"{base}&changed=1")
                                                      .content), repeat)
    return [page, plots, filtered, changed]


def index_case(folder: Path, count: int, repeat: int) -> list[Timed]:
    start = time.monotonic()
    with open_store(f"sqlite:///{folder / 'results.sqlite'}") as store:
        for run in index_runs(count):
            store.add_run(run)
    print(f"index: {count} runs stored in {time.monotonic() - start:.1f} s", flush=True)
    with served(folder) as client:
        index = measure("index page 1", lambda: len(fetch(client, "/dashboard").content),
                        repeat)
    index.targets = {"<= 1 s": max(index.cold_ms, index.warm_ms) <= INDEX_TARGET_MS}
    return [index]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nights", type=int, default=60)
    parser.add_argument("--wide-keys", type=int, default=4000)
    parser.add_argument("--index-runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    results: list[tuple[str, list[Timed]]] = []
    cases: list[tuple[str, Callable[[Path], list[Timed]]]] = [
        (f"{args.nights} nights of the main job",
         lambda f: branch_case(f, args.nights, args.repeat)),
        (f"one run of {args.wide_keys} figure keys",
         lambda f: wide_case(f, args.wide_keys, args.repeat)),
        (f"index over {args.index_runs} runs",
         lambda f: index_case(f, args.index_runs, args.repeat)),
    ]
    for title, case in cases:
        with tempfile.TemporaryDirectory(prefix="dashboard-speed-") as folder:
            results.append((title, case(Path(folder))))
    print()
    for title, measured in results:
        print(title)
        for one in measured:
            print(one.line())
    passed = all(ok for _, measured in results for one in measured
                 for ok in one.targets.values())
    print("all targets met" if passed else "a target was missed")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
