"""The rendered report, read from a real browser: suites, counts, and the run-history trend.

Two runs of the tiny suite (tests/data/allure/tiny_suite) are rendered with one history
file; the second report is served on loopback and opened in headless Chromium, and what
the page shows after the app has rendered is held against the results themselves. The
single-file variant is opened from file://. A screenshot of the report is attached to
this test's own Allure result and copied to ``$HARNESS_TEST_ARTIFACTS``.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import re
import shutil
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import allure
import httpx
import pytest
from playwright.sync_api import Browser, Page, Route, sync_playwright
from playwright.sync_api import TimeoutError as PlaywrightTimeout
from results_fixtures import make_run
from test_report import run_tiny_suite

from harness.plugin.required import skip_unless_present
from harness.report.allure import GROUP_BY, generate_report
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.bundle import make_bundle
from harness.service.reports import allure_generator
from harness.service.settings import ServiceSettings

CHROMIUM = shutil.which("chromium")
#: allure-pytest ships no type hints; the one call goes through this untyped name.
_attach_file: Any = allure.attach.file
DATE = re.compile(r"^\d{1,2}/\d{1,2}/\d{4}$")

NO_CHROMIUM = ("needs the system Chromium: `apt-get install chromium` (CI installs it)"
               if CHROMIUM is None else None)


@pytest.fixture(autouse=True)
def _needs_chromium() -> None:
    skip_unless_present("chromium", NO_CHROMIUM)


#: The labels the report's tree is grouped by (harness.report.allure.GROUP_BY).
SUITE_LABELS = frozenset(GROUP_BY)


def _truth(results: Path) -> tuple[set[str], Counter[str]]:
    """Suite names (every tree level) and status counts, read from the result files."""
    suites: set[str] = set()
    statuses: Counter[str] = Counter()
    for path in results.glob("*-result.json"):
        result = json.loads(path.read_text())
        statuses[result["status"]] += 1
        suites.update(label["value"] for label in result["labels"]
                      if label["name"] in SUITE_LABELS)
    return suites, statuses


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        return None


@pytest.fixture
def serve() -> Iterator[functools.partial[str]]:
    """``serve(directory)`` -> the URL of its index.html on a loopback HTTP server."""
    servers: list[http.server.ThreadingHTTPServer] = []

    def start(directory: Path) -> str:
        handler = functools.partial(_QuietHandler, directory=str(directory))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_port}/index.html"

    yield functools.partial(start)
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def browser() -> Iterator[Browser]:
    yield from launch_chromium()


def launch_chromium() -> Iterator[Browser]:
    """The system Chromium, headless, closed when the generator ends."""
    with sync_playwright() as playwright:
        # Root in a container: Chromium's sandbox cannot start, so it is turned off.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


#: Where a page under test may fetch from: its own file, inline data, and loopback.
LOCAL_SCHEMES = frozenset({"file", "data", "blob", "about", "chrome-error"})
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
#: The window every report is read in: wide enough for the tree beside a result, and
#: English, so dates and labels read as the tests expect.
REPORT_VIEW: dict[str, Any] = {"viewport": {"width": 1400, "height": 1000}, "locale": "en-US"}


@dataclass
class PageWatch:
    """What a page did besides rendering: requests off this machine (aborted, never
    sent), console errors, uncaught exceptions, a renderer crash."""

    off_host: list[str] = field(default_factory=list)
    console_errors: list[str] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    crashed: bool = False

    def story(self) -> str:
        return (f"renderer crashed: {self.crashed}; uncaught: {self.page_errors[-5:]}; "
                f"console errors: {self.console_errors[-5:]}; blocked: {self.off_host}")


def local_page(browser: Browser, **options: Any) -> tuple[Page, PageWatch]:
    """A new page that reaches nothing but this machine: a request to any other host is
    aborted before it leaves and recorded, so a test can say the report asked for none."""
    page = browser.new_page(**options)
    watch = PageWatch()

    def guard(route: Route) -> None:
        url = urlsplit(route.request.url)
        if url.scheme in LOCAL_SCHEMES or url.hostname in LOOPBACK_HOSTS:
            route.continue_()
        else:
            watch.off_host.append(route.request.url)
            route.abort("blockedbyclient")

    page.route("**/*", guard)
    page.on("console", lambda message: watch.console_errors.append(message.text)
            if message.type == "error" else None)
    page.on("pageerror", lambda error: watch.page_errors.append(str(error)))
    page.on("crash", lambda _: setattr(watch, "crashed", True))
    return page, watch


def _shown_counts(page: Page) -> dict[str, int]:
    """The status counts in the report header, once the app has rendered them."""
    page.wait_for_selector('[data-testid="metadata-item-total"]')
    counts = {}
    for status in ("total", "passed", "failed", "skipped"):
        item = page.locator(f'[data-testid="metadata-item-{status}"] '
                            '[data-testid="metadata-value"]')
        counts[status] = int(item.inner_text().strip())
    return counts


def _shown_suites(page: Page) -> set[str]:
    page.wait_for_selector('[data-testid="tree-section-title"]')
    return {t.strip() for t in
            page.locator('[data-testid="tree-section-title"]').all_inner_texts()}


def _trend_points(page: Page) -> list[str]:
    """The x-axis labels of the "Status dynamics" chart: one per run, the last "Latest"."""
    page.get_by_text("Status dynamics", exact=True).wait_for()
    widget = page.locator('[data-drop-shadow="true"]').filter(
        has=page.get_by_text("Status dynamics", exact=True))
    widget.locator("svg text").first.wait_for()
    labels = [t.strip() for t in widget.locator("svg text").all_text_contents()]
    return [label for label in labels if label == "Latest" or DATE.match(label)]


def keep_screenshot(page: Page, path: Path, name: str) -> None:
    """A full-page screenshot, attached to this test's Allure result and kept as an artifact."""
    page.screenshot(path=str(path), full_page=True)
    _keep_screenshot(path, name)


def trend_of(page: Page, url: str) -> list[str]:
    """The trend chart's run labels, read from the report's charts page."""
    page.goto(f"{url}#/charts")
    return _trend_points(page)


def _keep_screenshot(path: Path, name: str) -> None:
    _attach_file(str(path), name=name, attachment_type=allure.attachment_type.PNG)
    artifacts = os.environ.get("HARNESS_TEST_ARTIFACTS")
    if artifacts:
        Path(artifacts).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, Path(artifacts) / path.name)


def test_report_renders_counts_suites_and_trend(
        tmp_path: Path, browser: Browser, serve: functools.partial[str]) -> None:
    first = run_tiny_suite(tmp_path / "suite", tmp_path / "results-1")
    second = run_tiny_suite(tmp_path / "suite", tmp_path / "results-2", second_run=True)
    history = tmp_path / "allure-history.jsonl"
    output = tmp_path / "allure-report"
    generate_report(first, output, history_path=history)
    started = time.monotonic()
    report = generate_report(second, output, history_path=history)
    print(f"one report generation took {time.monotonic() - started:.1f}s")
    assert report.problems == ()
    assert len(history.read_text().splitlines()) == 2

    suites, statuses = _truth(second)
    assert statuses == {"passed": 2, "failed": 2, "skipped": 1}  # the run really differed
    expected = {"total": sum(statuses.values()), **statuses}

    page, watch = local_page(browser, **REPORT_VIEW)
    url = serve(output)
    page.goto(url)
    # The harness plugin adds the hardware as the parent suite above the two modules.
    assert {"test_alpha", "test_beta"} <= suites
    assert _shown_suites(page) == suites
    assert _shown_counts(page) == expected
    keep_screenshot(page, tmp_path / "allure-report.png", "report screenshot")

    # The trend: the earlier run from the history file, then this one.
    points = trend_of(page, url)
    assert len(points) == 2, points
    assert DATE.match(points[0])
    assert points[1] == "Latest"
    trend = tmp_path / "allure-report-trend.png"
    page.screenshot(path=str(trend), full_page=True)
    _keep_screenshot(trend, "report trend screenshot")
    assert watch.off_host == []  # the report asks nothing of another host


def test_single_file_report_opens_from_disk(tmp_path: Path, browser: Browser) -> None:
    results = run_tiny_suite(tmp_path / "suite", tmp_path / "results")
    report = generate_report(results, tmp_path / "single", single_file=True)
    assert not (report.output_dir / "data").exists()  # everything is inlined
    suites, statuses = _truth(results)
    # The page renders in 2 to 10 s here even beside two builds. In CI it failed to
    # render within the 30 s default twice and within 90 s once (no log of why was
    # kept), so a page that shows nothing in
    # 45 s is reported with what it did (crash, errors, blocked requests) and the file is
    # opened once more in a fresh page; what it must show is checked in full either way.
    for attempt in (1, 2):
        page, watch = local_page(browser, **REPORT_VIEW)
        page.set_default_timeout(45_000)
        try:
            page.goto(report.index_html.as_uri())
            shown = _shown_suites(page)
        except PlaywrightTimeout:
            if attempt == 2:
                pytest.fail(f"the one-file report did not render twice: {watch.story()}")
            print(f"the one-file report did not render in 45 s, opened again: {watch.story()}")
            page.close()
            continue
        assert shown == suites
        assert _shown_counts(page) == {"total": sum(statuses.values()), **statuses}
        assert watch.off_host == []
        break


def _attach_html(results: Path) -> str:
    """Give one result of ``results`` an HTML attachment with a script in it."""
    result_file = sorted(results.glob("*-result.json"))[0]
    result = json.loads(result_file.read_text())
    source = "hostile-attachment.html"
    (results / source).write_text("<script>window.parent.pwned = true</script><p>hi</p>")
    result.setdefault("attachments", []).append(
        {"name": "hostile page", "source": source, "type": "text/html"})
    result_file.write_text(json.dumps(result))
    return source


def test_the_report_works_in_chromium_when_served_by_the_service(
        tmp_path: Path, browser: Browser) -> None:
    """The service's headers (nosniff; sandbox and download for attachments) keep the
    report's app working: it renders, and it can still fetch its attachments."""
    results = run_tiny_suite(tmp_path / "suite", tmp_path / "allure-results")
    _attach_html(results)
    suites, statuses = _truth(results)
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_run("browser-1").to_json()))
    bundle = make_bundle(run_json, results, tmp_path / "bundle.tar.gz")
    data = tmp_path / "data"
    app = create_app(ServiceSettings(data_dir=data, token="t" * 32,
                                     results_url=f"sqlite:///{tmp_path / 'r.sqlite'}",
                                     report_generator=allure_generator))
    with serve_in_thread(app) as url:
        answer = httpx.post(f"{url}/api/runs", content=bundle.read_bytes(), timeout=60,
                            headers={"Authorization": f"Bearer {'t' * 32}",
                                     "Content-Type": "application/gzip"})
        assert answer.status_code == 201, answer.text
        assert app.state.service.reports.wait_idle(180)
        state = httpx.get(f"{url}/api/runs/browser-1").json()["report"]
        assert state["state"] == "ready", state
        attachments = sorted((data / "runs" / "browser-1" / "report" / "data"
                              / "attachments").glob("*.html"))
        assert attachments, "Allure copied the HTML attachment into the report"
        served = httpx.get(f"{url}/runs/browser-1/report/data/attachments/"
                           f"{attachments[0].name}")
        assert served.headers["content-security-policy"] == "sandbox"
        assert served.headers["content-disposition"] == "attachment"

        page, watch = local_page(browser, **REPORT_VIEW)
        page.goto(f"{url}/runs/browser-1/report/")
        assert _shown_suites(page) == suites
        assert _shown_counts(page) == {"total": sum(statuses.values()), **statuses}
        fetched = page.evaluate(
            "name => fetch('data/attachments/' + name).then(r => r.text())",
            attachments[0].name)
        assert "<p>hi</p>" in fetched
        assert page.evaluate("() => window.pwned === undefined")
        keep_screenshot(page, tmp_path / "service-report.png", "report served by the service")
        assert watch.off_host == []
