"""Allure's analytics tags come out of a report, and nothing else does (report/offline.py)."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from harness.report.offline import external_script_sources, untrack_report, untracked_html

#: The tail of an Awesome index.html as Allure 3.18 writes it (generators.js template).
TRACKED = """<body>
    <div id="app"></div>
    <script>
      window.allure = window.allure || {};
    </script>
    <script src="data:text/javascript;base64,QUJD"></script>
    <script async src="https://www.googletagmanager.com/gtag/js?id=G-LNDJ3J7WT0"></script>
    <script>
        window.dataLayer = window.dataLayer || [];
        function gtag(){dataLayer.push(arguments);}
        gtag('js', new Date());
        gtag('config', 'G-LNDJ3J7WT0', {
          "report": "awesome",
          "single_file": "true"
        });
    </script>
    <script async>
      window.allureReportDataReady = false;
    </script>
</body>
"""


def test_the_loader_and_its_configuration_go_and_every_other_script_stays() -> None:
    cleaned = untracked_html(TRACKED)
    assert external_script_sources(TRACKED) == [
        "https://www.googletagmanager.com/gtag/js?id=G-LNDJ3J7WT0"]
    assert external_script_sources(cleaned) == []
    assert "gtag" not in cleaned
    assert "dataLayer" not in cleaned
    for kept in ("window.allure = window.allure || {};",
                 '<script src="data:text/javascript;base64,QUJD"></script>',
                 "window.allureReportDataReady = false;", '<div id="app"></div>'):
        assert kept in cleaned
    assert untracked_html(cleaned) == cleaned


def test_a_page_without_the_tags_is_unchanged() -> None:
    page = TRACKED.replace("gtag", "other").replace("googletagmanager", "example")
    assert untracked_html(page) == page


@given(st.text(alphabet="<>/=\"' scriptgagtmn\n(){}.", max_size=300))
def test_any_text_without_a_gtag_call_or_loader_stays_as_it_was(text: str) -> None:
    if "gtag" in text or "googletagmanager" in text:
        return
    assert untracked_html(text) == text


def test_only_the_reports_own_pages_are_rewritten(tmp_path: Path) -> None:
    (tmp_path / "index.html").write_text(TRACKED)
    attachment = tmp_path / "data" / "attachments" / "page.html"
    attachment.parent.mkdir(parents=True)
    attachment.write_text(TRACKED)  # a test's own file: the report must show it as it was
    assert untrack_report(tmp_path) == 1
    assert "gtag" not in (tmp_path / "index.html").read_text()
    assert attachment.read_text() == TRACKED
    assert untrack_report(tmp_path) == 0
