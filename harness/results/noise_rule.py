"""The history rule on one figure: is a value a regression, an improvement or noise?

Pure and cheap (:func:`judge` is a mean, a stdev and two comparisons), so benchmarks
can simulate its false-alarm and detection rates directly. Its defaults are
harness/results/rules.py's; :mod:`harness.results.comparison` applies it to every
figure of a run.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import ConfigError
from harness.results.rules import NOISE_MIN_RUNS, NOISE_THRESHOLD, NOISE_Z, FigureStatus
from harness.results.run_record import Direction


@dataclass(frozen=True)
class NoiseRule:
    """When a figure's move counts: beyond ``threshold`` (relative) AND ``z`` stdevs.

    Needing both keeps a tiny but very consistent change (huge z) and a large change
    on a noisy figure (small z) from raising alarms. Fewer than ``min_runs`` baseline
    values and the figure is not judged at all.
    """

    threshold: float = NOISE_THRESHOLD
    z: float = NOISE_Z
    min_runs: int = NOISE_MIN_RUNS

    def __post_init__(self) -> None:
        if not self.threshold >= 0:
            raise ConfigError(f"noise threshold {self.threshold} must be >= 0 "
                              "(a fraction: 0.05 is 5 %)")
        if not self.z >= 0:
            raise ConfigError(f"noise z {self.z} must be >= 0")
        if self.min_runs < 2:
            raise ConfigError(f"min runs {self.min_runs} must be at least 2: a spread "
                              "needs two baseline values")


#: The rule with harness/results/rules.py's defaults (frozen, so one value serves all).
DEFAULT_NOISE_RULE = NoiseRule()


@dataclass(frozen=True)
class Judgement:
    """The verdict on one figure and the numbers behind it."""

    status: FigureStatus
    n: int
    mean: float | None
    stdev: float | None
    #: (current - mean) / mean, signed; None without a baseline.
    change: float | None
    #: |current - mean| / stdev; inf when the baseline never varied and current differs.
    z: float | None


def judge(baseline_values: Sequence[float], current: float, direction: Direction,
          rule: NoiseRule = DEFAULT_NOISE_RULE, min_change: float = 0.0) -> Judgement:
    """Is ``current`` a regression, an improvement or noise against ``baseline_values``?

    ``min_change`` is the metric's absolute floor (``Metric.min_change``): a move smaller
    than it never counts, whatever its relative size and z.
    """
    n = len(baseline_values)
    mean = statistics.fmean(baseline_values) if n else None
    stdev = statistics.stdev(baseline_values) if n >= 2 else None
    if n < rule.min_runs or mean is None or stdev is None:
        return Judgement(FigureStatus.NO_BASELINE, n, mean, stdev, None, None)
    if mean != 0:
        change = (current - mean) / mean
    else:
        change = 0.0 if current == 0 else math.copysign(math.inf, current)
    spread = abs(current - mean)
    # A baseline that never varied makes any difference infinitely many stdevs away.
    z = spread / stdev if stdev > 0 else (math.inf if spread else 0.0)
    worsening = change if direction is Direction.LOWER_IS_BETTER else -change
    status = FigureStatus.UNCHANGED
    if z > rule.z and spread >= min_change:
        if worsening > rule.threshold:
            status = FigureStatus.REGRESSED
        elif -worsening > rule.threshold:
            status = FigureStatus.IMPROVED
    return Judgement(status, n, mean, stdev, change, z)
