"""The release matrix kept as stored runs, and shown by the service's dashboard."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from results_fixtures import CPU_BOX, GPU_BOX, at, make_run, outcome
from service_helpers import no_report

from harness.results.release_matrix import Column
from harness.results.release_runs import (
    RELEASES_BRANCH,
    matrix_from_runs,
    matrix_run,
    release_of,
)
from harness.results.run_record import Hardware, RunRecord
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.dashboard_page import PAGE_CSP
from harness.service.settings import ServiceSettings

PIN = 11434
UNSUPPORTED = "not supported by this build: --n-cpu-ffn"


def _suite_run(run_id: str, minute: int, *, b_passes: bool = True,
               unsupported: bool = False, hardware: Hardware = CPU_BOX) -> RunRecord:
    return make_run(run_id, branch="main", started_at=at(minute), hardware=hardware,
                    outcomes=[outcome("suites/t.py::test_a"),
                              outcome("suites/t.py::test_b",
                                      "passed" if b_passes else "failed",
                                      message=None if b_passes else "HTTP 500"),
                              outcome("suites/t.py::test_c", "skipped",
                                      message=UNSUPPORTED) if unsupported
                              else outcome("suites/t.py::test_c")])


def _stored(runs: list[tuple[RunRecord, int, bool]]) -> list[RunRecord]:
    """As ``harness releases --store`` keeps them, newest first (list_runs' order)."""
    kept = [matrix_run(run, release, pinned=pinned) for run, release, pinned in runs]
    return sorted(kept, key=lambda r: r.started_at, reverse=True)


def test_a_release_run_is_stored_under_the_releases_branch_with_its_labels() -> None:
    run = replace(_suite_run("r1", 1), labels={"runner": "ci-1"})
    kept = matrix_run(run, 10502, pinned=False)
    assert kept.branch == RELEASES_BRANCH
    assert kept.labels == {"runner": "ci-1", "job": "releases", "release": "10502",
                           "pin": "no"}
    assert release_of(kept) == 10502
    assert (kept.outcomes, kept.run_id) == (run.outcomes, run.run_id)
    assert release_of(make_run("plain")) is None


def test_the_matrix_takes_each_releases_newest_run_and_judges_against_the_pins() -> None:
    stored = _stored([
        (_suite_run("pin-old", 1, b_passes=False), PIN, True),
        (_suite_run("pin-new", 5), PIN, True),
        (_suite_run("old-a", 2), 10502, False),
        (_suite_run("old-b", 6, b_passes=False, unsupported=True), 10502, False),
        (_suite_run("mid", 3), 10901, False),
    ])
    rows = matrix_from_runs(stored)
    assert [(r.release, r.pinned) for r in rows] == [(PIN, True), (10502, False),
                                                     (10901, False)]
    pin, old, mid = rows
    assert pin.counts[Column.PASSED] == 3
    # The newest 10502 run: test_b failed where the pin's newest passed, test_c skipped.
    assert (old.counts[Column.PASSED], old.counts[Column.DIFFERENCE],
            old.counts[Column.UNSUPPORTED]) == (1, 1, 1)
    assert mid.counts[Column.PASSED] == 3
    assert all(r.counts[Column.ERROR] == 0 for r in rows)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, str]]:
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token="t" * 32,
                                     results_url=url, report_generator=no_report))
    with serve_in_thread(app) as base:
        yield base, url


def test_the_dashboard_shows_the_matrix_per_hardware(service: tuple[str, str]) -> None:
    base, url = service
    with open_store(url) as store:
        for run in _stored([(_suite_run("pin", 1), PIN, True),
                            (_suite_run("old", 2, b_passes=False), 10502, False),
                            (_suite_run("gpu-pin", 3, hardware=GPU_BOX), PIN, True)]):
            assert store.add_run(run)
    index = httpx.get(f"{base}/dashboard/releases", timeout=30)
    assert index.status_code == 200
    assert index.headers["content-security-policy"] == PAGE_CSP
    assert "<script" not in index.text
    assert index.text.count("<tr><td>") == 2  # two hardware
    page = httpx.get(f"{base}/dashboard/releases", params={"hardware": CPU_BOX.identity},
                     timeout=30)
    assert page.status_code == 200
    rows = re.findall(r"<tr><td>(b\d+(?: \(pin\))?)</td>((?:<td>\d+</td>)+)</tr>", page.text)
    cells = {name: [int(n) for n in re.findall(r"<td>(\d+)</td>", found)]
             for name, found in rows}
    columns = [column.value for column in Column]
    assert cells[f"b{PIN} (pin)"][columns.index(Column.PASSED.value)] == 3
    assert cells["b10502"][columns.index(Column.DIFFERENCE.value)] == 1
    assert list(cells) == [f"b{PIN} (pin)", "b10502"]
    # The dashboards' index links the releases branch to its matrix.
    dashboards = httpx.get(f"{base}/dashboard", timeout=30).text
    assert "release matrix" in dashboards
    empty = httpx.get(f"{base}/dashboard/releases", params={"hardware": "nowhere"},
                      timeout=30)
    assert empty.status_code == 200
    assert "No release runs stored on this hardware" in empty.text
