"""A decode wait sized again from what it cost solo, where the construction missed.

The benchmark sizes a decode wait by construction: a wait of w µs a token should slow a
decode of b tokens/s by exactly w·b / (1 + w·b). On four of seven VMs (2026-12-07) it
did not: solo, 50 µs cost 111 µs a token, 97 µs cost 146, 89 µs cost 115, and on the
seventh 74 µs cost 92, 62 µs 105 and 1 µs 18. Decisions at such a
wait land at a larger true size than the level they are filed under, so the level's cell
says nothing about that level. Where the solo measurement settles it (its interval of
the size excludes the level), this module gives the wait that the measured cost per µs
of wait says would make the level: the wait scaled by the extra time a token should take
(the construction's, at the solo pairs' own baseline speed) over the extra time it took.
The new wait is then measured solo again; nothing here assumes the scaling holds, and
on the seventh VM it did not: the cost there fits a fixed 20 to 40 µs a token with the spin
on plus the wait, so scaling 74 µs down to 62 µs made the size larger (docs/ab.md).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from harness.builds.slowed import wait_for_slowdown

#: The fewest values a median's interval is given for.
MIN_INTERVAL_PAIRS = 6


def median_interval(values: Sequence[float]) -> tuple[float, float, float] | None:
    """The median of ``values`` and its distribution-free 95 % interval (the order
    statistics a binomial(n, 1/2) count puts around the middle); None under
    ``MIN_INTERVAL_PAIRS`` values."""
    if len(values) < MIN_INTERVAL_PAIRS:
        return None
    ordered = sorted(values)
    n = len(ordered)
    half_width = 1.96 * math.sqrt(n) / 2.0
    low = max(0, math.floor(n / 2.0 - half_width))
    high = min(n - 1, math.ceil(n / 2.0 + half_width) - 1)
    return statistics.median(ordered), ordered[low], ordered[high]


def resized_wait(wait_us: int, level: float,
                 solo_pairs: Sequence[tuple[float, float]]) -> int | None:
    """The wait to measure instead of ``wait_us``, from its solo (baseline, candidate)
    decode speeds; None where the solo size's interval holds ``level`` (the construction
    held), where it is too short to say, or where the wait cost nothing measurable."""
    effects = [1.0 - candidate / baseline for baseline, candidate in solo_pairs]
    found = median_interval(effects)
    if found is None:
        return None
    _, low, high = found
    if low <= level <= high:
        return None
    extra_us = statistics.median(1e6 / candidate - 1e6 / baseline
                                 for baseline, candidate in solo_pairs)
    if extra_us <= 0.0:
        return None
    speed = statistics.median(baseline for baseline, _ in solo_pairs)
    wanted_us = wait_for_slowdown(level, speed)
    return max(1, round(wait_us * wanted_us / extra_us))
