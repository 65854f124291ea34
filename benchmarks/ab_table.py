"""Cells of the detection benchmark's markdown tables that more than one table prints."""

from __future__ import annotations

import statistics
from typing import Any

from harness.ab.stats import wilson_interval


def rate_text(hits: int, total: int) -> str:
    """``hits/total`` with its Wilson 95 % interval; "none" without decisions."""
    if total == 0:
        return "none"
    low, high = wilson_interval(hits, total)
    return f"{hits}/{total} ({low:.0%} to {high:.0%})"


def median_time_text(decisions: list[dict[str, Any]]) -> str:
    """The median time to a verdict over the decisions that reached one."""
    times = [e["decided_after_s"] for e in decisions if e["decided_after_s"] is not None]
    return f"{statistics.median(times):.0f} s" if times else "—"
