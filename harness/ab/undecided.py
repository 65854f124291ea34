"""An undecided A/B comparison, and what would decide it (pure).

A comparison is undecided when nothing regressed (and the numbers did not change) but
at least one metric is still ``unknown`` and not settled: its interval straddles an
edge of the band, or it has too few pairs, or it lies in the band under a design this
runner has not validated. A settled ``unknown`` (a change under the metric's floor:
:func:`harness.ab.decision.decide_metric`) is not undecided: more pairs would not judge
it, its reason says where the metric is large enough to, and counting it would make
every comparison of ``load_s`` on ``bench`` (its 50 ms floor at a 70 ms load) undecided.

What would decide a straddling interval is estimated from the data alone: the
interval's half-width shrinks about as 1/√pairs, so it clears the band's edge nearest
the ratio after about pairs * (half-width / distance from the ratio to that edge)²
pairs. Both are taken on the log scale the interval is computed on
(:func:`harness.ab.stats.paired_ratio_interval`), where the band is symmetric. It is
a rough figure: the spread of the pairs and the ratio itself move as pairs come in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.ab.decision import FLOOR_HINTS, MetricDecision
from harness.ab.stats import RatioInterval
from harness.ab.validation import CALIBRATE_HINT
from harness.results.rules import AbVerdict

#: A ratio nearer an edge than this, in log terms (0.05 %, under the table's three
#: decimals), sits on it: no number of pairs moves the interval off an edge its centre
#: lies on.
ON_EDGE = 5e-4


@dataclass(frozen=True)
class Edge:
    """One edge of the band: 1 - t (lower) or 1 / (1 - t) (upper)."""

    value: float
    lower: bool

    def describe(self) -> str:
        return f"the band's {'lower' if self.lower else 'upper'} edge {self.value:.3f}"


def band_edges(threshold: float) -> tuple[Edge, Edge]:
    """The band of :func:`harness.ab.decision.decide`: [1 - t, 1 / (1 - t)]."""
    low = 1 - threshold
    return Edge(low, lower=True), Edge(1 / low, lower=False)


def straddled_edge(interval: RatioInterval, threshold: float) -> Edge:
    """The edge the interval straddles nearest its ratio; the nearest edge where it
    straddles none (its ratio then already decides it, and only its spread is left).

    "Straddles" as :func:`harness.ab.decision.decide` reads the ends: the lower edge
    while low < edge <= high, the upper while low <= edge < high.
    """
    low, high = band_edges(threshold)
    straddled = [edge for edge, inside in (
        (low, interval.low < low.value <= interval.high),
        (high, interval.low <= high.value < interval.high)) if inside]

    def distance(edge: Edge) -> float:
        return abs(math.log(interval.ratio) - math.log(edge.value))
    return min(straddled or [low, high], key=distance)


def pairs_to_clear(interval: RatioInterval, edge: Edge) -> float | None:
    """About how many pairs in all the interval needs to clear ``edge``; None when its
    ratio sits on the edge (:data:`ON_EDGE`), where more pairs cannot settle it."""
    distance = abs(math.log(interval.ratio) - math.log(edge.value))
    if distance < ON_EDGE:
        return None
    half_width = (math.log(interval.high) - math.log(interval.low)) / 2
    return interval.pairs * (half_width / distance) ** 2


def _more(pairs: int, seconds_per_pair: float | None, *, at_least: bool = False) -> str:
    said = f"{'at least' if at_least else 'about'} {pairs} more pair{'s' if pairs != 1 else ''}"
    if seconds_per_pair is None:
        return said
    return f"{said} (≈ {pairs * seconds_per_pair:.0f} s at this rate)"


def would_decide(decision: MetricDecision, seconds_per_pair: float | None,
                 min_pairs: int) -> str:
    """One sentence: what would turn this ``unknown`` into a verdict.

    ``seconds_per_pair``: the comparison's wall time per pair so far (None without
    pairs); ``min_pairs``: the rule's fewest pairs for a verdict.
    """
    metric, interval = decision.metric, decision.interval
    if decision.settled:
        return (f"more pairs will not: the change is under {metric}'s floor; measure "
                f"where the metric is larger ({FLOOR_HINTS.get(metric, 'a larger fixture')})")
    if interval is None or decision.pairs < min_pairs:
        short = max(1, min_pairs - decision.pairs)
        return (f"{_more(short, seconds_per_pair, at_least=True)}: no verdict from fewer "
                f"than {min_pairs} pairs")
    if decision.reason is not None:
        # earn_unchanged's reason: an "unchanged" this design has not earned here.
        return ("more pairs cannot make it unchanged: the interval lies in the band, but "
                f"the design is not validated for {metric} on this runner; {CALIBRATE_HINT}")
    edge = straddled_edge(interval, decision.threshold)
    total = pairs_to_clear(interval, edge)
    if total is None:
        return (f"its ratio {interval.ratio:.3f} sits on {edge.describe()}: more pairs "
                "cannot settle it, the change is at the threshold itself")
    more = max(1, math.ceil(total) - decision.pairs)
    return f"it straddles {edge.describe()}: {_more(more, seconds_per_pair)} would clear it"


def is_undecided(decision: MetricDecision) -> bool:
    """An ``unknown`` that more measuring, a validated design or a rerun could decide."""
    return decision.verdict is AbVerdict.UNKNOWN and not decision.settled


def undecided_metrics(decisions: Iterable[MetricDecision], *, failed: bool) -> list[str]:
    """The metrics that leave a comparison undecided, in its order; none when it
    ``failed`` (a regression or changed numbers decide the comparison whatever else is
    unknown)."""
    return [] if failed else [d.metric for d in decisions if is_undecided(d)]


def seconds_per_pair(elapsed_s: float, pairs: int) -> float | None:
    return elapsed_s / pairs if pairs > 0 else None


def undecided_line(decision: MetricDecision, seconds_per_pair: float | None,
                   min_pairs: int) -> str:
    """The table's ``undecided:`` line: the ratio and interval, the band, then
    :func:`would_decide`'s sentence, which names the edge the interval straddles."""
    interval, band = decision.interval, f"band ±{decision.threshold:.1%}"
    shown = (f"no interval yet ({decision.pairs} pairs, {band})" if interval is None else
             f"ratio {interval.ratio:.3f}, {interval.confidence:.0%} interval "
             f"[{interval.low:.3f}, {interval.high:.3f}] ({band})")
    return (f"undecided: {decision.metric}: {shown}; "
            f"{would_decide(decision, seconds_per_pair, min_pairs)}")


def undecided_lines(decisions: Sequence[MetricDecision], *, failed: bool,
                    elapsed_s: float, min_pairs: int) -> list[str]:
    """One :func:`undecided_line` per metric that leaves the comparison undecided."""
    named = set(undecided_metrics(decisions, failed=failed))
    return [undecided_line(d, seconds_per_pair(elapsed_s, d.pairs), min_pairs)
            for d in decisions if d.metric in named]
