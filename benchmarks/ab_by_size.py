"""Decode-wait decisions counted by the size their wait had at the decision itself.

The benchmark sizes a decode wait once per machine, from the baseline's speed at the
start of the run: a level of 3 % is a wait that costs 3 % at that speed. A VM's speed
drifts, though (480 to 740 tokens/s of `bench` within one run, 2026-12-07), and a fixed
wait costs more of a faster token: the same 68 µs was 3.3 % of one decision and 4.8 % of
another. Each decision's own baseline arm measured the speed it ran at, so the size its
wait made there follows from the construction (``slowdown_of_wait``) without the
candidate's figures, which are what the design under test compares. Counting decisions
by that size, in bands one point wide, keeps a 3 % row to decisions that were about 3 %,
and pools machines whose speeds differ. It is the construction's size, which assumes a
wait costs its length: the solo line the report prints for each wait checks that, and
where the two disagree (one VM: a 50 µs wait cost 111 µs a token, solo) the bands are
floors, not sizes.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Any

from ab_table import median_time_text, rate_text

from harness.builds.slowed import slowdown_of_wait

#: Band width: each band is its centre ± half of this.
BAND = 0.01


def constructed_at(decision: dict[str, Any], metric: str) -> float | None:
    """The size the decision's wait made at the speeds its own baseline arm measured
    (the median over its pairs); None without pairs."""
    pairs = decision["pairs"].get(metric) or []
    if not pairs:
        return None
    return statistics.median(slowdown_of_wait(decision["amount"], b) for b, _ in pairs)


def band_of(size: float) -> float:
    """The centre of the band ``size`` falls in."""
    return round(size / BAND) * BAND


def by_size_rows(decisions: Iterable[dict[str, Any]], metric: str,
                 verdict_of: Callable[[dict[str, Any]], str]) -> list[str]:
    """Markdown rows, one per design and band: decisions, regressed with its Wilson 95 %
    interval, unchanged, unknown, the sizes' median and the median decision time."""
    groups: dict[tuple[str, float], list[tuple[float, dict[str, Any]]]] = {}
    for decision in decisions:
        size = constructed_at(decision, metric)
        if size is not None:
            groups.setdefault((decision["design"], band_of(size)), []).append(
                (size, decision))
    rows = []
    for (design, centre), members in sorted(groups.items()):
        decided = [d for _, d in members]
        verdicts = Counter(verdict_of(d) for d in decided)
        rows.append(
            f"| {centre:.0%} ({centre - BAND / 2:.1%} to {centre + BAND / 2:.1%}) | "
            f"{design} | {len(decided)} | {rate_text(verdicts['regressed'], len(decided))} | "
            f"{verdicts['unchanged']} | {verdicts['unknown']} | "
            f"{statistics.median(s for s, _ in members):.1%} | "
            f"{median_time_text(decided)} |")
    return rows


def print_by_size(decisions: Iterable[dict[str, Any]], metric: str,
                  verdict_of: Callable[[dict[str, Any]], str], label: str) -> None:
    """The by-size table of ``label``'s decisions, or nothing where none has pairs."""
    rows = by_size_rows(decisions, metric, verdict_of)
    if not rows:
        return
    print(f"\n{label}: the decisions by the size the wait made at each (constructed "
          "from the decision's own baseline speeds):")
    print("\n| size at the decision | design | decisions | regressed (95 %) | unchanged | "
          "unknown | size, median | decision (median) |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        print(row)
