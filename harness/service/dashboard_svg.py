"""One dashboard series as a standalone SVG document (pure), written as plain text.

Why not matplotlib, which drew these plots before: it took about half a second a plot
on the 2-core CI machine, so a branch page of 180 series took over a minute, and what
it wrote depended on its version and font metrics. A series needs only a line, a few
marks and two axes, and this writer draws one in about a millisecond; its output is a
function of the series alone, so :func:`svg_key` (a hash of what is drawn) names the
document for the service's cache and its ETag.

The page shows a plot as an ``<img>``, which cannot hold links; opened on its own (the
page links every plot to its own URL) the same document is interactive: every measured
point links to its run's Allure report and names its run in a tooltip. What it holds,
by id (the browser test counts them):

- ``g#points``: one ``<a href>`` per run, oldest first, with a ``<circle>`` and a ``<title>``;
- ``polyline#line``: the measured series;
- ``g#band``: one polygon per stretch of runs the history rule judged, its passing band;
- ``g#predicted``: the predicted decode speed, dashed, where runs recorded one;
- ``g#regressed`` and ``g#improved``: a triangle over each run the rule called so;
- ``g#ab``: each A/B verdict, written at its run ("undecided" in orange: never a pass);
- ``g#bisect``: a dashed line at each run that carries a bisect (``harness bisect
  --record``, the nightly's ``HARNESS_NIGHTLY_BISECT``), its finding written at the top.

Text from the store is escaped, and characters XML cannot hold are replaced, so no
store value can break the document or add markup; it holds no script.
"""

from __future__ import annotations

import hashlib
import html
import math
import re
from collections.abc import Callable, Sequence
from urllib.parse import quote

from harness.results.rules import FigureStatus
from harness.service.dashboard import UNDECIDED, DashboardPoint, DashboardSeries

#: Bumped whenever the drawing changes, so no cache or browser keeps an old plot.
WRITER_VERSION = "2"
WIDTH, HEIGHT = 900, 270
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 20, 28, 64
#: Space between the plot's edge and its first and last run.
_INSET = 12
#: Most date labels under one plot; more would overlap.
_MAX_LABELS = 20
_BLUE, _GREY, _RED, _GREEN = "#1f77b4", "#7f7f7f", "#d62728", "#2ca02c"
_PURPLE = "#9467bd"
_ORANGE = "#ff7f0e"
#: Characters XML 1.0 cannot hold (C0 controls but tab and newlines, lone surrogates,
#: U+FFFE/U+FFFF): each becomes U+FFFD.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")


def report_url(run_id: str) -> str:
    return f"/runs/{quote(run_id, safe='')}/report/"


def svg_key(series: DashboardSeries) -> str:
    """24 hex digits naming what :func:`series_svg` draws for ``series``."""
    digest = hashlib.sha256(f"{WRITER_VERSION}\0{series.title}\0".encode(
        "utf-8", "surrogatepass"))
    for p in series.points:
        drawn = (p.run_id, p.started_at, p.commit, p.value, p.predicted, p.band,
                 p.status.value, p.ab_verdict, p.bisect)
        digest.update(repr(drawn).encode("utf-8", "surrogatepass"))
    return digest.hexdigest()[:24]


def series_svg(series: DashboardSeries, link: Callable[[str], str] = report_url) -> str:
    """The SVG document of ``series`` (XML declaration included)."""
    points = series.points
    low, high = _y_range(points)
    scale = _Scale(len(points), low, high)
    parts = [
        '<?xml version="1.0" encoding="UTF-8"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="11" '
        f'role="img" aria-label="{_x(series.title)}">',
        f"<title>{_x(series.title)}</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#fff"/>',
        *_axes(series, points, scale),
        *_band(points, scale),
        *_predicted(points, scale),
    ]
    if points:
        line = " ".join(f"{scale.x(i)},{scale.y(p.value)}" for i, p in enumerate(points))
        parts.append(f'<polyline id="line" points="{line}" fill="none" stroke="{_BLUE}" '
                     'stroke-width="1.2"/>')
    parts += _points(series, points, scale, link)
    for status, (word, colour) in _MARKS.items():
        parts += _marks(points, scale, status, word, colour)
    parts += _ab(points, scale)
    parts += _bisects(points, scale)
    parts += _legend(points)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


class _Scale:
    """Run index and value to pixel coordinates (as text, one decimal)."""

    def __init__(self, runs: int, low: float, high: float) -> None:
        self.runs, self.low, self.high = runs, low, high
        self.width = WIDTH - _LEFT - _RIGHT
        self.height = HEIGHT - _TOP - _BOTTOM

    def x(self, index: int) -> str:
        if self.runs < 2:
            return f"{_LEFT + self.width / 2:.1f}"
        step = (self.width - 2 * _INSET) / (self.runs - 1)
        return f"{_LEFT + _INSET + index * step:.1f}"

    def y(self, value: float) -> str:
        return f"{self.y_px(value):.1f}"

    def y_px(self, value: float) -> float:
        return _TOP + (self.high - value) / (self.high - self.low) * self.height


def _y_range(points: Sequence[DashboardPoint]) -> tuple[float, float]:
    values = [p.value for p in points]
    values += [p.predicted for p in points if p.predicted is not None]
    values += [edge for p in points if p.band is not None for edge in p.band]
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    span = high - low
    # A flat series still gets a visible range around it.
    pad = span * 0.08 if span > 0 and math.isfinite(span) else max(abs(high) * 0.05, 1.0)
    return low - pad, high + pad


def _ticks(low: float, high: float) -> tuple[list[float], int]:
    """About six round values between low and high, and the decimals they need."""
    raw = (high - low) / 6
    if not math.isfinite(raw) or raw <= 0:
        return [low, high], 2
    power = 10.0 ** math.floor(math.log10(raw))
    multiple = next(m for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)
    step = multiple * power
    first = math.ceil(low / step)
    ticks = [n * step for n in range(first, math.floor(high / step) + 1)]
    decimals = max(0, -math.floor(math.log10(step)))
    if multiple == 2.5 and power <= 1:
        decimals += 1
    return ticks, decimals


def _axes(series: DashboardSeries, points: Sequence[DashboardPoint],
          scale: _Scale) -> list[str]:
    bottom = _TOP + scale.height
    right = _LEFT + scale.width
    parts = ['<g id="axes" stroke="#ccc" stroke-width="1">',
             f'<line x1="{_LEFT}" y1="{_TOP}" x2="{_LEFT}" y2="{bottom}" stroke="#888"/>',
             f'<line x1="{_LEFT}" y1="{bottom}" x2="{right}" y2="{bottom}" stroke="#888"/>']
    ticks, decimals = _ticks(scale.low, scale.high)
    labels = []
    for value in ticks:
        y_tick = scale.y(value)
        parts.append(f'<line x1="{_LEFT}" y1="{y_tick}" x2="{right}" y2="{y_tick}"/>')
        labels.append(f'<text x="{_LEFT - 6}" y="{y_tick}" dy="0.35em" '
                      f'text-anchor="end">{value:.{decimals}f}</text>')
    parts.append("</g>")
    parts.append('<g id="y-labels" fill="#333">')
    parts += labels
    middle = _TOP + scale.height / 2
    parts.append(f'<text x="14" y="{middle:.1f}" text-anchor="middle" '
                 f'transform="rotate(-90 14 {middle:.1f})">{_x(series.metric.unit)}</text>')
    parts.append("</g>")
    every = max(1, math.ceil(len(points) / _MAX_LABELS))
    parts.append('<g id="x-labels" fill="#333" font-size="9">')
    for index, point in enumerate(points):
        if index % every:
            continue
        x, y = scale.x(index), f"{bottom + 12:.1f}"
        when = point.started_at[:16].replace("T", " ")
        parts.append(f'<text x="{x}" y="{y}" text-anchor="end" '
                     f'transform="rotate(-30 {x} {y})">{_x(when)}</text>')
    parts.append("</g>")
    return parts


def _stretches(points: Sequence[DashboardPoint],
               has: Callable[[DashboardPoint], bool]) -> list[list[int]]:
    """Runs of consecutive indexes whose points ``has`` holds for."""
    found: list[list[int]] = []
    for index, point in enumerate(points):
        if not has(point):
            continue
        if found and found[-1][-1] == index - 1:
            found[-1].append(index)
        else:
            found.append([index])
    return found


def _band(points: Sequence[DashboardPoint], scale: _Scale) -> list[str]:
    stretches = _stretches(points, lambda p: p.band is not None)
    if not stretches:
        return []
    parts = [f'<g id="band" fill="{_BLUE}" fill-opacity="0.15" stroke="none">']
    for stretch in stretches:
        upper = [f"{scale.x(i)},{scale.y(_edge(points[i], 1))}" for i in stretch]
        lower = [f"{scale.x(i)},{scale.y(_edge(points[i], 0))}" for i in reversed(stretch)]
        parts.append(f'<polygon points="{" ".join(upper + lower)}"/>')
    parts.append("</g>")
    return parts


def _edge(point: DashboardPoint, side: int) -> float:
    assert point.band is not None
    return point.band[side]


def _predicted(points: Sequence[DashboardPoint], scale: _Scale) -> list[str]:
    stretches = _stretches(points, lambda p: p.predicted is not None)
    if not stretches:
        return []
    parts = [f'<g id="predicted" fill="none" stroke="{_GREY}" stroke-width="1.2" '
             'stroke-dasharray="5 3">']
    for stretch in stretches:
        line = " ".join(f"{scale.x(i)},{scale.y(points[i].predicted or 0.0)}"
                        for i in stretch)
        parts.append(f'<polyline points="{line}"/>')
    parts.append("</g>")
    return parts


def _points(series: DashboardSeries, points: Sequence[DashboardPoint], scale: _Scale,
            link: Callable[[str], str]) -> list[str]:
    parts = [f'<g id="points" fill="{_BLUE}">']
    unit = series.metric.unit
    for index, point in enumerate(points):
        when = point.started_at[:16].replace("T", " ")
        said = f"{when} · {point.commit[:12]} · {point.value:.6g} {unit} · {point.status}"
        if point.band is not None:
            said += f" (passes {point.band[0]:.6g} to {point.band[1]:.6g})"
        parts.append(f'<a href="{_x(link(point.run_id))}"><title>{_x(said)}</title>'
                     f'<circle cx="{scale.x(index)}" cy="{scale.y(point.value)}" r="3.5"/>'
                     "</a>")
    parts.append("</g>")
    return parts


#: Triangles over a judged run: ▼ regressed, ▲ improved (as paths from above the point).
_MARKS = {FigureStatus.REGRESSED: ("regressed", _RED),
          FigureStatus.IMPROVED: ("improved", _GREEN)}
_SHAPES = {"regressed": "h10 l-5,8 z", "improved": "m5,0 l5,8 h-10 z"}


def _marks(points: Sequence[DashboardPoint], scale: _Scale, status: FigureStatus,
           word: str, colour: str) -> list[str]:
    hit = [i for i, p in enumerate(points) if p.status is status]
    if not hit:
        return []
    parts = [f'<g id="{word}" fill="{colour}">']
    for index in hit:
        x = float(scale.x(index)) - 5
        y = scale.y_px(points[index].value) - 16
        parts.append(f'<path d="M{x:.1f},{y:.1f} {_SHAPES[word]}"/>')
    parts.append("</g>")
    return parts


def _ab(points: Sequence[DashboardPoint], scale: _Scale) -> list[str]:
    said = [(i, p) for i, p in enumerate(points) if p.ab_verdict is not None]
    if not said:
        return []
    parts = ['<g id="ab" fill="#333" font-size="9" text-anchor="middle">']
    for index, point in said:
        y = scale.y_px(point.value) - 20
        # An undecided A/B stands out from the verdicts: it must not read as a pass.
        colour = f' fill="{_ORANGE}"' if point.ab_verdict == UNDECIDED else ""
        parts.append(f'<text x="{scale.x(index)}" y="{y:.1f}"{colour}>'
                     f"A/B {_x(point.ab_verdict or '')}</text>")
    parts.append("</g>")
    return parts


def _bisects(points: Sequence[DashboardPoint], scale: _Scale) -> list[str]:
    marked = [(i, p) for i, p in enumerate(points) if p.bisect is not None]
    if not marked:
        return []
    parts = [f'<g id="bisect" fill="{_PURPLE}" stroke="{_PURPLE}" font-size="9">']
    for index, point in marked:
        x = scale.x(index)
        parts.append(f'<line x1="{x}" y1="{_TOP}" x2="{x}" y2="{HEIGHT - _BOTTOM}" '
                     'stroke-dasharray="3 3"/>'
                     f'<text x="{x}" y="{_TOP + 8}" dx="3" stroke="none">'
                     f"bisect: {_x(point.bisect or '')}</text>")
    parts.append("</g>")
    return parts


def _legend(points: Sequence[DashboardPoint]) -> list[str]:
    """A row of keys over the plot, only for what it draws."""
    keys = [(f'<circle cx="5" cy="-4" r="3.5" fill="{_BLUE}"/>', "measured")]
    if any(p.band is not None for p in points):
        keys.append((f'<rect y="-9" width="10" height="10" fill="{_BLUE}" '
                     'fill-opacity="0.15"/>', "gate band"))
    if any(p.predicted is not None for p in points):
        keys.append((f'<line x1="0" y1="-4" x2="14" y2="-4" stroke="{_GREY}" '
                     'stroke-dasharray="5 3"/>', "predicted"))
    for status, (word, colour) in _MARKS.items():
        if any(p.status is status for p in points):
            keys.append((f'<path d="M0,-9 {_SHAPES[word]}" fill="{colour}"/>', word))
    if any(p.bisect is not None for p in points):
        keys.append((f'<line x1="5" y1="-10" x2="5" y2="2" stroke="{_PURPLE}" '
                     'stroke-dasharray="3 3"/>', "bisect"))
    parts = ['<g id="legend" fill="#333" font-size="10">']
    x = _LEFT
    for mark, word in keys:
        parts.append(f'<g transform="translate({x} 16)">{mark}'
                     f'<text x="18" y="0">{word}</text></g>')
        # About 6 px a character at this size: the keys never overlap.
        x += 30 + 6 * len(word)
    parts.append("</g>")
    return parts


def _x(text: str) -> str:
    """``text`` as XML character data or attribute value."""
    return html.escape(_NOT_XML.sub("\ufffd", text), quote=True)
