"""The release matrix page: one row a release, from the runs ``harness releases --store``
kept in the store (pure).

``/dashboard/releases`` lists the hardware with stored release runs;
``/dashboard/releases?hardware=H`` shows the matrix on that hardware: for each release
its newest run, counted in the matrix's columns (passed, failed, skipped as
unsupported, differences from the pin, harness errors), the differences judged
against the newest run of the pin. Script-free, under the dashboard's CSP.
"""

from __future__ import annotations

from collections.abc import Sequence
from urllib.parse import urlencode

from harness.results.release_matrix import Column, ReleaseRow
from harness.results.store_listing import RunPair
from harness.service.dashboard_page import PAGE_PATH, RELEASES_PATH, escaped, page_document

TITLE = "llama.cpp releases against the pin"


def render_release_index(pairs: Sequence[RunPair]) -> str:
    """The hardware with stored release runs, each linking to its matrix."""
    if not pairs:
        return page_document(TITLE, "<p>No release runs stored yet: run <code>harness "
                             "releases --store</code>.</p>")
    rows = "".join(
        f"<tr><td><a href=\"{escaped(_matrix_url(p.hardware))}\"><code>"
        f"{escaped(p.hardware)}</code></a></td><td>{p.runs}</td><td>{escaped(p.latest)}</td>"
        "</tr>" for p in sorted(pairs, key=lambda p: p.latest, reverse=True))
    return page_document(TITLE, f"<p><a href=\"{PAGE_PATH}\">all dashboards</a></p>"
                         "<table><tr><th>hardware</th><th>runs</th><th>latest</th></tr>"
                         f"{rows}</table>")


def render_matrix(hardware: str, rows: Sequence[ReleaseRow]) -> str:
    """The matrix of ``rows`` (the pin's first) on ``hardware``."""
    back = (f"<p><a href=\"{PAGE_PATH}\">all dashboards</a> · <a href=\"{RELEASES_PATH}\">"
            f"all hardware</a> · hardware <code>{escaped(hardware)}</code></p>")
    if not rows:
        return page_document(TITLE, back + "<p>No release runs stored on this hardware.</p>")
    head = "".join(f"<th>{escaped(column.value)}</th>" for column in Column)
    body = "".join(
        f"<tr><td>b{row.release}{' (pin)' if row.pinned else ''}</td>"
        + "".join(f"<td>{row.counts.get(column, 0)}</td>" for column in Column)
        + "</tr>" for row in rows)
    note = ("<p>Each release's newest stored run; a difference is a test the pin's "
            "newest run passed and this release did not. <code>harness releases</code> "
            "writes each release's findings beside its run record.</p>")
    return page_document(TITLE, back + note + f"<table><tr><th>release</th>{head}</tr>"
                         f"{body}</table>")


def _matrix_url(hardware: str) -> str:
    return RELEASES_PATH + "?" + urlencode({"hardware": hardware})
