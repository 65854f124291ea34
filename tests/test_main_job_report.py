"""The main job's own report, read in a real browser: `harness run` twice, then the page.

Runs the main-job command (build cache hit, fixtures, the routing suite only, run record
into a scratch store, Allure report) twice with one history file, and checks in headless
Chromium that the second report shows the hardware as the parent suite, the real pass
and skip counts, and a trend holding the previous run.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
import test_report_browser as report_browser
from playwright.sync_api import Browser, Page
from test_report_browser import REPORT_VIEW, _shown_suites, keep_screenshot, local_page, trend_of

from harness.probes.hardware import detect_hardware
from harness.results.store import open_store

pytestmark = pytest.mark.server
# Chromium is required as in the report's own browser test (an autouse fixture there).
_needs_chromium = report_browser._needs_chromium
# The browser and loopback-server fixtures of the report's own browser test.
browser = report_browser.browser
serve = report_browser.serve

HARNESS = str(Path(sys.executable).with_name("harness"))


def _shown_count(page: Page, status: str) -> int:
    """One status count of the report header (only statuses that occurred are shown)."""
    page.wait_for_selector('[data-testid="metadata-item-total"]')
    item = page.locator(f'[data-testid="metadata-item-{status}"] '
                        '[data-testid="metadata-value"]')
    return int(item.inner_text().strip())


def _main_job(tmp: Path, number: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_ALLURE_HISTORY": str(tmp / "history.jsonl"),
           "HARNESS_RESULTS_URL": f"sqlite:///{tmp / 'results.sqlite'}"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)
    return subprocess.run(
        [HARNESS, "run", "--alluredir", str(tmp / "results"), "--report-dir",
         str(tmp / "report"), "--run-record", str(tmp / f"run-{number}.json"),
         "--workers", "1", "--", "-k", "test_routing", "-p", "no:cacheprovider"],
        env=env, capture_output=True, text=True, timeout=600, check=False)


def test_main_job_ends_with_a_report_whose_trend_shows_the_previous_run(
        tmp_path: Path, browser: Browser, serve: functools.partial[str]) -> None:
    for number in (1, 2):
        done = _main_job(tmp_path, number)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        index = tmp_path / "report" / "index.html"
        assert f"Allure report {index}" in " ".join(done.stderr.split()), done.stderr[-2000:]
    with open_store(f"sqlite:///{tmp_path / 'results.sqlite'}") as store:
        runs = store.list_runs()
    assert len(runs) == 2
    assert all(run.figures for run in runs), "every run keeps its servers' figures"

    statuses = Counter(json.loads(p.read_text())["status"]
                       for p in (tmp_path / "results").glob("*-result.json"))
    assert statuses["passed"] > 0
    page, watch = local_page(browser, **REPORT_VIEW)
    url = serve(tmp_path / "report")
    page.goto(url)
    assert _shown_suites(page) == {detect_hardware().describe()}
    assert _shown_count(page, "total") == sum(statuses.values())
    for status, count in statuses.items():
        assert _shown_count(page, status) == count, status
    keep_screenshot(page, tmp_path / "main-job-report.png", "main job report screenshot")

    points = trend_of(page, url)
    assert len(points) == 2, points
    assert points[-1] == "Latest"
    assert watch.off_host == []
