"""The gate's rules' defaults and verdict words, in one place (pure constants and enums).

Two rules decide whether a build got slower. The history rule
(:class:`harness.results.noise_rule.NoiseRule`) holds one run's figures against earlier
runs of the baseline branch: good for trends and nightly drift, blind to a few percent
on a noisy runner. The A/B rule (:class:`harness.ab.decision.AbRule`) measures the
baseline and candidate builds side by side in the same minutes and decides on paired
ratios. Their defaults live here so the two can be read, and tuned, together: the
compare CLI, the results service's ``/api/compare`` and the gate script all take theirs
from here.
"""

from __future__ import annotations

import enum


class FigureStatus(enum.StrEnum):
    """The history rule's word for one figure (our own design).

    They are what ``harness compare --json`` and the service's ``/api/compare`` write as a
    figure's ``status`` and as the keys of ``figure_counts``, in this order.
    """

    REGRESSED = "regressed"
    IMPROVED = "improved"
    UNCHANGED = "unchanged"
    #: Fewer than the rule's min_runs baseline values, so not judged.
    NO_BASELINE = "no baseline"
    #: The figure is in the baseline runs but not in the run now.
    MISSING_NOW = "missing now"


class AbVerdict(enum.StrEnum):
    """The A/B rule's word for one metric (our own design).

    Stored as each metric's ``verdict`` in run.json's ``ab`` object (the run schema's enum
    is built from this class, in this order), so a value, once written, is kept. The first
    three are the history rule's words for the same outcome.
    """

    REGRESSED = "regressed"
    UNCHANGED = "unchanged"
    IMPROVED = "improved"
    #: The budget ran out before the interval cleared the threshold band.
    UNKNOWN = "unknown"


# The history rule: beyond 5 % AND 3 stdevs of at least 3 baseline runs, out of the 5
# runs of the baseline window (the named run and those before it).
NOISE_THRESHOLD = 0.05
NOISE_Z = 3.0
NOISE_MIN_RUNS = 3
NOISE_WINDOW = 5

# The A/B rule: the whole 95 % interval of the paired ratio beyond 3 %; no verdict from
# fewer than 6 pairs; 180 s of measuring; interleaved blocks of 4 starts (ABBA/BAAB).
AB_THRESHOLD = 0.03
AB_CONFIDENCE = 0.95
AB_MIN_PAIRS = 6
AB_BUDGET_S = 180.0
AB_BLOCK_SIZE = 4
# ``harness ab``'s extension: up to this many seconds past the budget while an interval
# lies wholly beyond "no change" but straddles the threshold (a shown change whose size
# is not settled yet). The library rule's default is none (bisect and tune keep their
# own budgets); the command's is this.
AB_EXTEND_S = 180.0
# ``harness ab``'s sampling (docs/ab.md, "More signal per second"); the library's
# AbSettings keeps the plain measurement (64 tokens, no warm-up, no pinned client, no
# covariate) for bisect and tune. None: sized by the probe start (harness/ab/sampling.py).
# Decode stays 64 tokens: sized to the noise (1024 tokens on the 2-core VM) a pair took
# 13 times as long and the spread fell less than that (benchmarks/ab_signal.py).
AB_GEN_TOKENS: int | None = 64
AB_WARMUP: int | None = None
AB_PIN_CLIENT = True
# The machine's speed around each start: 1.26 times fewer seconds to an interval on the
# sequential design there; the slot's share was nothing measurable (0.92-1.05).
AB_COVARIATE = "machine"
