"""The performance dashboard's HTML: one server-drawn SVG plot per series, no JavaScript.

Each plot is drawn by matplotlib (its object API, not pyplot: the service renders from
worker threads) and inlined, so a point can be a link: every measured point links to
its run's Allure report. In each plot's SVG the measured points are the marks of the
group ``points-<n>`` (one ``<use>`` per run), regressions and improvements the history
rule found are marked over them (``regressed-<n>``, ``improved-<n>``), the band the rule
lets pass is shaded, the prediction is a dashed line and A/B verdicts are written at
their runs. Text from the store is escaped; the page needs no script, and its
Content-Security-Policy (:data:`PAGE_CSP`) allows none.
"""

from __future__ import annotations

import html
import io
from collections.abc import Callable, Sequence
from urllib.parse import quote, urlencode

from matplotlib import rc_context
from matplotlib.figure import Figure

from harness.results.rules import FigureStatus
from harness.service.dashboard import DashboardSeries, IndexRow

#: No script, no frames, nothing fetched but this origin's own links; inline styles are
#: what matplotlib's SVG uses for its colours.
PAGE_CSP = ("default-src 'none'; style-src 'unsafe-inline'; img-src 'self' data:; "
            "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_STYLE = ("body{font-family:sans-serif;margin:1.5em;max-width:70em}"
          "h2{font-size:1em;margin:1.5em 0 .2em}table{border-collapse:collapse}"
          "td,th{border:1px solid #ccc;padding:.2em .6em;text-align:left}")
_MARKS = {FigureStatus.REGRESSED: ("regressed", "v", "#d62728"),
          FigureStatus.IMPROVED: ("improved", "^", "#2ca02c")}


def report_url(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}/report/"


def render_page(branch: str, hardware: str, description: str,
                series: Sequence[DashboardSeries],
                link: Callable[[str], str] = report_url) -> str:
    """The dashboard of one branch on one hardware."""
    title = f"{branch} on {description or hardware}"
    runs = {p.run_id for s in series for p in s.points}
    parts = [f"<p><a href=\"/dashboard\">all dashboards</a> · branch "
             f"<code>{_e(branch)}</code> · hardware <code>{_e(hardware)}</code> · "
             f"{len(runs)} runs, {len(series)} plots. Each point links to its run's Allure "
             "report; the shaded band is what the gate's history rule lets pass against the "
             "runs before it, ▼/▲ the regressions and improvements it found, the dashed line "
             "the predicted decode speed, and A/B verdicts are written at their runs.</p>"]
    if not series:
        parts.append("<p>No figures stored for this branch on this hardware yet.</p>")
    for number, one in enumerate(series):
        parts.append(f"<h2 id=\"plot-{number}\">{_e(one.title)}</h2>")
        parts.append(series_svg(one, number, link))
    return _page(title, "".join(parts))


def render_index(rows: Sequence[IndexRow]) -> str:
    """Every branch and hardware with stored runs, each linking to its dashboard."""
    if not rows:
        body = "<p>No runs stored yet.</p>"
    else:
        lines = "".join(
            f"<tr><td><a href=\"/dashboard?{_e(_query(r))}\">{_e(r.branch)}</a></td>"
            f"<td>{_e(r.description)}</td><td><code>{_e(r.hardware)}</code></td>"
            f"<td>{r.runs}</td><td>{_e(r.latest)}</td></tr>" for r in rows)
        body = ("<table><tr><th>branch</th><th>hardware</th><th>identity</th><th>runs</th>"
                f"<th>latest</th></tr>{lines}</table>")
    return _page("performance dashboards", body)


def series_svg(series: DashboardSeries, number: int,
               link: Callable[[str], str] = report_url) -> str:
    """One series as an inline ``<svg>`` element (no XML prologue)."""
    points = series.points
    xs = list(range(len(points)))
    ys = [p.value for p in points]
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": f"plot-{number}"}):
        figure = Figure(figsize=(9, 2.8), layout="constrained")
        axes = figure.add_subplot()
        banded = [(x, p.band) for x, p in enumerate(points) if p.band is not None]
        if banded:
            axes.fill_between([x for x, _ in banded], [b[0] for _, b in banded],
                              [b[1] for _, b in banded], color="#1f77b4", alpha=0.15,
                              linewidth=0, gid=f"band-{number}", label="gate band")
        axes.plot(xs, ys, color="#1f77b4", linewidth=1, gid=f"line-{number}")
        marks = axes.scatter(xs, ys, s=18, color="#1f77b4", zorder=3, gid=f"points-{number}",
                             label="measured")
        marks.set_urls([link(p.run_id) for p in points])
        for status, (word, marker, colour) in _MARKS.items():
            hit = [(x, p.value) for x, p in enumerate(points) if p.status is status]
            if hit:
                axes.scatter([x for x, _ in hit], [y for _, y in hit], s=60, marker=marker,
                             color=colour, zorder=4, gid=f"{word}-{number}", label=word)
        predicted = [(x, p.predicted) for x, p in enumerate(points) if p.predicted is not None]
        if predicted:
            axes.plot([x for x, _ in predicted], [y for _, y in predicted], "--",
                      color="#7f7f7f", linewidth=1, gid=f"predicted-{number}",
                      label="predicted")
        for x, point in enumerate(points):
            if point.ab_verdict is not None:
                axes.annotate(f"A/B {point.ab_verdict}", (x, point.value), fontsize=7,
                              xytext=(0, 8), textcoords="offset points", ha="center")
        axes.set_ylabel(series.metric.unit)
        axes.set_xticks(xs, [p.started_at[:16].replace("T", " ") for p in points],
                        rotation=30, ha="right", fontsize=7)
        axes.margins(x=0.03)
        axes.legend(fontsize=7, loc="best")
        buffer = io.StringIO()
        figure.savefig(buffer, format="svg")
    text = buffer.getvalue()
    return text[text.index("<svg"):]


def _query(row: IndexRow) -> str:
    return urlencode({"branch": row.branch, "hardware": row.hardware})


def _page(title: str, body: str) -> str:
    return (f"<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>"
            f"{_e(title)}</title><style>{_STYLE}</style></head><body><h1>{_e(title)}</h1>"
            f"{body}</body></html>")


def _e(text: str) -> str:
    return html.escape(text, quote=True)
