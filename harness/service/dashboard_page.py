"""The performance dashboard's HTML pages (pure): the index, and a branch page of plots.

A branch page is an index of plots, not the plots: one section per series of the page
with its title, the history rule's verdict on it, and an ``<img>`` of its SVG
(harness/service/dashboard_svg.py) at a URL that names the runs it shows, which the
browser fetches, caches and — opened on its own — follows links in. So a page costs the
same to send whatever its plots hold, and a plot is drawn once for a set of runs.

A form (a plain GET to the same page) filters the series by fixture, metric and "changed
only"; pages hold :data:`~harness.service.dashboard_view.PAGE_SIZE` series and link
their neighbours. No script: the Content-Security-Policy (:data:`PAGE_CSP`) allows none,
and text from the store is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping
from urllib.parse import urlencode

from harness.results.release_runs import RELEASES_BRANCH
from harness.results.rules import FigureStatus
from harness.service.dashboard import DashboardSeries, IndexRow, TuneNote
from harness.service.dashboard_svg import HEIGHT, WIDTH, WRITER_VERSION
from harness.service.dashboard_view import DashboardModel, Paged, SeriesFilter

#: No script, no frames, nothing fetched but this origin's plots; the only form is the
#: filter, a GET to this page.
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; "
            "base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
#: A plot opened on its own: nothing to run, load or embed it in.
PLOT_CSP = "default-src 'none'; frame-ancestors 'none'"
#: Bumped whenever the page's HTML changes, so no browser revalidates an old one as current.
PAGE_VERSION = "1"
PAGE_PATH = "/dashboard"
PLOT_PATH = "/dashboard/plot.svg"
#: The release matrix (harness/service/dashboard_releases.py).
RELEASES_PATH = "/dashboard/releases"
_STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:70em}"
          "h2{font-size:1em;margin:1.5em 0 .2em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}"
          "img{max-width:100%;height:auto;border:1px solid #eee}"
          ".regressed{color:#d62728}.improved{color:#2ca02c}"
          "form label{margin-right:1em}")
#: Most fixtures the filter offers as a list; past it the fixture is typed.
_MAX_CHOICES = 200
_WORDS = {FigureStatus.REGRESSED: "regressed ▼", FigureStatus.IMPROVED: "improved ▲"}


def plot_version(model: DashboardModel) -> str:
    """What a plot URL's ``v`` is while the model is current: its runs and the writer."""
    return f"{model.version}-{WRITER_VERSION}"


def plot_url(model: DashboardModel, series: DashboardSeries) -> str:
    """Where ``series`` is drawn over the model's runs; ``v`` names what it draws, so the
    browser may keep the answer for as long as it likes."""
    return PLOT_PATH + "?" + urlencode({
        "branch": model.branch, "hardware": model.hardware, "limit": model.limit,
        "series": series.ident, "v": plot_version(model)})


def page_url(model: DashboardModel, chosen: SeriesFilter, page: int) -> str:
    query: dict[str, str | int] = {"branch": model.branch, "hardware": model.hardware,
                                   "limit": model.limit}
    if chosen.fixture is not None:
        query["fixture"] = chosen.fixture
    if chosen.metric is not None:
        query["metric"] = chosen.metric
    if chosen.changed_only:
        query["changed"] = 1
    if page != 1:
        query["page"] = page
    return PAGE_PATH + "?" + urlencode(query)


def render_page(model: DashboardModel, shown: Paged[DashboardSeries],
                chosen: SeriesFilter) -> str:
    """Page ``shown.page`` of the series of one branch on one hardware."""
    title = f"{model.branch} on {model.description or model.hardware}"
    parts = [f"<p><a href=\"{PAGE_PATH}\">all dashboards</a> · branch "
             f"<code>{_e(model.branch)}</code> · hardware <code>{_e(model.hardware)}</code> · "
             f"the newest {model.runs} runs, {len(model.series)} series. A plot opened on its "
             "own links each point to its run's Allure report; the shaded band is what the "
             "gate's history rule lets pass against the runs before it, ▼/▲ the regressions "
             "and improvements it found, the dashed line the predicted decode speed, A/B "
             "verdicts are written at their runs (an A/B that could not decide, in orange, "
             "says undecided: it is no pass), and a dashed upright line marks a run "
             "that carries a bisect (listed below).</p>"]
    if model.bisects:
        parts.append("<section id=\"bisects\"><h2>Bisects</h2><ul>" + "".join(
            f"<li>run <code>{_e(note.run_id)}</code> ({_e(note.started_at)}): "
            f"{_e(note.finding)} <small>({_e(note.oracle)})</small></li>"
            for note in model.bisects) + "</ul></section>")
    if model.tunes:
        parts.append("<section id=\"tunes\"><h2>Card tunes</h2><ul>" + "".join(
            _tune_item(note) for note in model.tunes) + "</ul></section>")
    if not model.series:
        parts.append("<p>No figures stored for this branch on this hardware yet.</p>")
        return _page(title, "".join(parts))
    parts.append(_filter_form(model, chosen))
    pager = _pager(model, chosen, shown)
    parts.append(pager)
    if not shown.items:
        parts.append("<p>No series on this page: "
                     + ("it is past the last one." if shown.total else
                        "none matches the filter.") + "</p>")
    for series in shown.items:
        url = _e(plot_url(model, series))
        parts.append(
            f"<section id=\"s-{series.ident}\"><h2>{_e(series.title)}</h2>"
            f"{_verdict(series, model.runs)}<a href=\"{url}\"><img src=\"{url}\" "
            f"width=\"{WIDTH}\" height=\"{HEIGHT}\" loading=\"lazy\" "
            f"alt=\"{_e(series.title)}\"></a></section>")
    if shown.items:
        parts.append(pager)
    return _page(title, "".join(parts))


def render_index(rows: Paged[IndexRow], filters: Mapping[str, str]) -> str:
    """Every branch and hardware with stored runs, each linking to its dashboard.

    ``filters`` are the index's own query parameters (branch, hardware), kept in its
    page links.
    """
    if not rows.total:
        said = "No runs match." if filters else "No runs stored yet."
        return _page("performance dashboards", f"<p>{said}</p>")
    lines = "".join(
        f"<tr><td><a href=\"{_e(_branch_url(r))}\">{_e(r.branch)}</a>{_matrix_link(r)}</td>"
        f"<td>{_e(r.description)}</td><td><code>{_e(r.hardware)}</code></td>"
        f"<td>{r.runs}</td><td>{_e(r.latest)}</td></tr>" for r in rows.items)
    links = _neighbours(rows.page, rows.pages, lambda n: PAGE_PATH + "?" + urlencode(
        {**filters, **({"page": n} if n != 1 else {})}))
    counted = (f"<p>branches and hardware {rows.first}&ndash;{rows.last} of {rows.total} · page "
               f"{rows.page} of {rows.pages}{links}</p>" if rows.items else
               f"<p>Page {rows.page} is past the last ({rows.pages}).{links}</p>")
    table = ("<table><tr><th>branch</th><th>hardware</th><th>identity</th><th>runs</th>"
             f"<th>latest</th></tr>{lines}</table>") if rows.items else ""
    return _page("performance dashboards", counted + table)


def _matrix_link(row: IndexRow) -> str:
    if row.branch != RELEASES_BRANCH:
        return ""
    url = RELEASES_PATH + "?" + urlencode({"hardware": row.hardware})
    return f" · <a href=\"{_e(url)}\">release matrix</a>"


def _branch_url(row: IndexRow) -> str:
    return PAGE_PATH + "?" + urlencode({"branch": row.branch, "hardware": row.hardware})


def _verdict(series: DashboardSeries, runs: int) -> str:
    newest = series.points[-1]
    word = _WORDS.get(newest.status, str(newest.status))
    said = f"newest run: <b>{_e(word)}</b>, {newest.value:.6g} {_e(series.metric.unit)}"
    if newest.band is not None:
        said += f" (the gate lets {newest.band[0]:.6g} to {newest.band[1]:.6g} pass)"
    counts = [f"{sum(p.status is status for p in series.points)} {status}"
              for status in _WORDS]
    said += f" · over {len(series.points)} of the {runs} runs: {', '.join(counts)}"
    css = newest.status.value if newest.status in _WORDS else "verdict"
    return f"<p class=\"{css}\">{said}</p>"


def _filter_form(model: DashboardModel, chosen: SeriesFilter) -> str:
    hidden = "".join(f"<input type=\"hidden\" name=\"{name}\" value=\"{_e(str(value))}\">"
                     for name, value in (("branch", model.branch),
                                         ("hardware", model.hardware),
                                         ("limit", model.limit)))
    shown_fixture = chosen.fixture or ""
    if len(model.fixtures) <= _MAX_CHOICES:
        listed = _options(("", "all"), [(f, f) for f in model.fixtures], shown_fixture)
        fixtures = f"<select name=\"fixture\">{listed}</select>"
    else:
        # A list as long as the fixtures would make the page grow with the run.
        fixtures = (f"<input type=\"text\" name=\"fixture\" value=\"{_e(shown_fixture)}\" "
                    "placeholder=\"all\">")
    metrics = _options(("all", "all"), [(m, m) for m in model.metrics],
                       chosen.metric or "all")
    checked = " checked" if chosen.changed_only else ""
    return (f"<form method=\"get\" action=\"{PAGE_PATH}\">{hidden}"
            f"<label>fixture {fixtures}</label>"
            f"<label>metric <select name=\"metric\">{metrics}</select></label>"
            f"<label><input type=\"checkbox\" name=\"changed\" value=\"1\"{checked}> "
            "changed only (regressed or improved in these runs)</label>"
            "<button type=\"submit\">show</button></form>")


def _options(first: tuple[str, str], rest: list[tuple[str, str]], selected: str) -> str:
    return "".join(
        f"<option value=\"{_e(value)}\"{' selected' if value == selected else ''}>"
        f"{_e(label)}</option>" for value, label in [first, *rest])


def _pager(model: DashboardModel, chosen: SeriesFilter, shown: Paged[DashboardSeries]) -> str:
    links = _neighbours(shown.page, shown.pages, lambda n: page_url(model, chosen, n))
    if not shown.items:
        return f"<p>page {shown.page} of {shown.pages}{links}</p>"
    return (f"<p>series {shown.first}&ndash;{shown.last} of {shown.total} · page {shown.page} of "
            f"{shown.pages}{links}</p>")


def _neighbours(page: int, pages: int, url: Callable[[int], str]) -> str:
    """Links to the first, previous, next and last pages that exist."""
    found = []
    if page > 1:
        found.append(f"<a href=\"{_e(url(1))}\">first</a>")
        found.append(f"<a href=\"{_e(url(min(page - 1, pages)))}\" rel=\"prev\">previous</a>")
    if page < pages:
        found.append(f"<a href=\"{_e(url(page + 1))}\" rel=\"next\">next</a>")
        found.append(f"<a href=\"{_e(url(pages))}\">last</a>")
    return "".join(f" · {link}" for link in found)


def page_document(title: str, body: str) -> str:
    """A whole dashboard page: the title, the style, ``body`` (already escaped HTML)."""
    return _page(title, body)


def escaped(text: str) -> str:
    return _e(text)


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{_e(title)}</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>"
            f"{body}</body></html>")


def _e(text: str) -> str:
    return html.escape(text, quote=True)


def _tune_item(note: TuneNote) -> str:
    stale = '<strong>stale card</strong> (a warning): ' if note.stale else ""
    return (f"<li>run <code>{_e(note.run_id)}</code> ({_e(note.started_at)}), card "
            f"<code>{_e(note.card)}</code>: {stale}{_e(note.finding)}</li>")
