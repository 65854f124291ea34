"""The gate's rules' defaults and verdict words, in one place (pure constants).

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

# Verdicts, shared by both rules.
REGRESSED = "regressed"
IMPROVED = "improved"
UNCHANGED = "unchanged"
#: A/B only: the budget ran out before the interval cleared the threshold band.
UNKNOWN = "unknown"
#: History only: fewer than the rule's min_runs baseline values, so not judged.
NO_BASELINE = "no baseline"
#: History only: the figure is in the baseline runs but not in the run now.
MISSING_NOW = "missing now"

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
