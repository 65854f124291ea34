"""Compare a run with its baseline runs: which tests broke, which figures moved beyond noise.

Pure: the baseline runs come in as records (:mod:`harness.results.baseline_selection`
picks them from the store), each figure is judged by the history rule
(:mod:`harness.results.noise_rule`), and :mod:`harness.results.comparison_render`
writes the result out.

A run may also carry its own paired A/B result (``RunRecord.ab``, from ``harness ab
--record``): two builds measured side by side, decided by its own rule rather than
against history. The comparison shows it as is, and a metric it calls regressed fails
the comparison as a regressed figure does, and so does its numbers' verdict. An A/B
result that regressed nothing but left metrics undecided (its ``undecided`` list,
``harness ab`` exit 3) heads the report as undecided, not as a pass; it does not fail
the comparison, whose exit status stays about regressions (the gate's A/B step
decides what an undecided A/B does to the job).

A run of the numerics suite keeps each probe's fingerprint (``RunRecord.numerics``);
each is held to the baseline's (:mod:`harness.results.numerics_comparison`), and a
probe whose numbers changed fails the comparison as a newly failing test does.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from harness.errors import HarnessError
from harness.facts.gpu import GpuConfig
from harness.numerics.fingerprint import NumericsVerdict
from harness.results.drift import Drift, measured_drift
from harness.results.noise_rule import DEFAULT_NOISE_RULE, Judgement, NoiseRule, judge
from harness.results.numerics_comparison import ProbeNumerics, compare_numerics
from harness.results.rules import AbVerdict, FigureStatus
from harness.results.run_record import (
    FAILING_OUTCOMES,
    METRICS,
    FigureKey,
    Hardware,
    Outcome,
    RunRecord,
    figure_medians,
    metric_direction,
    metric_unit,
)


class HardwareMismatchError(HarnessError):
    """Baseline and current runs ran on different hardware; their figures do not compare."""

    def __init__(self, baseline: Hardware, current: Hardware, baseline_run: str,
                 current_run: str) -> None:
        super().__init__(
            f"baseline run {baseline_run} ran on {baseline.describe()}, but run "
            f"{current_run} ran on {current.describe()}; figures only compare on the "
            "same hardware: pick a baseline from this hardware (a branch name or run "
            "id stored by this machine, or `latest`)")
        self.baseline = baseline
        self.current = current


@dataclass(frozen=True)
class TestChange:
    """A test's outcome in the anchor baseline run and now (None: not in that run)."""

    test_id: str
    before: Outcome | None
    after: Outcome | None
    message: str | None = None


@dataclass(frozen=True)
class FigureResult:
    key: FigureKey
    metric: str
    unit: str
    #: None when the figure is only in the baseline (status ``FigureStatus.MISSING_NOW``).
    current: float | None
    judgement: Judgement

    @property
    def status(self) -> FigureStatus:
        return self.judgement.status

    @property
    def label(self) -> str:
        return self.key.label()


@dataclass(frozen=True)
class Comparison:
    baseline_run_ids: tuple[str, ...]
    current_run_id: str
    hardware: Hardware
    rule: NoiseRule
    newly_failing: tuple[TestChange, ...] = ()
    fixed: tuple[TestChange, ...] = ()
    still_failing: tuple[TestChange, ...] = ()
    new_tests: tuple[TestChange, ...] = ()
    removed_tests: tuple[TestChange, ...] = ()
    figure_results: tuple[FigureResult, ...] = field(default=())
    #: The current run's A/B result (RunRecord.ab), or None.
    ab: dict[str, Any] | None = None
    #: The current run's bisect (RunRecord.bisect): the commit that caused its
    #: regression, or None. Reported, not judged.
    bisect: dict[str, Any] | None = None
    #: The current run's tune of its card (RunRecord.tune): a stale card is a warning,
    #: reported, not judged.
    tune: dict[str, Any] | None = None
    #: Decode figures that left their card's calibrated band (reported, not judged).
    drift: tuple[Drift, ...] = ()
    #: Each numerics probe of the run against the baseline's fingerprint.
    numerics: tuple[ProbeNumerics, ...] = ()

    def figures_with(self, status: FigureStatus) -> list[FigureResult]:
        return [r for r in self.figure_results if r.status == status]

    @property
    def regressions(self) -> list[FigureResult]:
        return self.figures_with(FigureStatus.REGRESSED)

    @property
    def improvements(self) -> list[FigureResult]:
        return self.figures_with(FigureStatus.IMPROVED)

    @property
    def ab_metrics(self) -> list[tuple[str, dict[str, Any]]]:
        """The A/B result's metrics in METRICS order (the store keeps them sorted by name)."""
        if self.ab is None:
            return []
        found: dict[str, dict[str, Any]] = self.ab["metrics"]
        return [(name, found[name]) for name in METRICS if name in found]

    @property
    def ab_regressions(self) -> list[str]:
        """Metrics the current run's A/B result calls regressed, in METRICS order."""
        return [name for name, m in self.ab_metrics if m["verdict"] == AbVerdict.REGRESSED]

    @property
    def ab_numerics_changed(self) -> bool:
        """Whether the current run's A/B result says the candidate's numbers changed."""
        numbers = (self.ab or {}).get("numerics")
        return numbers is not None and numbers["verdict"] == NumericsVerdict.CHANGED.value

    @property
    def ab_undecided(self) -> list[str]:
        """Metrics the current run's A/B result left undecided; none when it regressed
        or changed the numbers (then it is decided: regressed)."""
        if self.ab_regressions or self.ab_numerics_changed:
            return []
        return undecided_of(self.ab)

    def ab_would_decide(self, metric: str) -> str | None:
        """What would decide an undecided A/B metric, as the record says."""
        found = dict(self.ab_metrics).get(metric, {}).get("would_decide")
        return found if isinstance(found, str) else None

    @property
    def numerics_changes(self) -> list[ProbeNumerics]:
        return [probe for probe in self.numerics if probe.changed]

    @property
    def regressed(self) -> bool:
        # An A/B regression counts like a figure's: both say the candidate build is
        # slower, and `harness compare` exits 1 on either. Changed numbers count too:
        # a build that computes other numbers is the regression users meet most.
        return (bool(self.newly_failing) or bool(self.regressions)
                or bool(self.ab_regressions) or self.ab_numerics_changed
                or bool(self.numerics_changes))


def undecided_of(ab: dict[str, Any] | None) -> list[str]:
    """The metrics an A/B result (a run record's ``ab``) left undecided, in METRICS order.

    Read from its ``undecided`` list, which ``harness ab`` writes empty when the result
    is decided (it regressed, or changed the numbers, or decided every metric). A
    record written before that list existed has none and is not called undecided: its
    ``unknown`` verdicts cannot tell an undecided metric from a settled one (a change
    under the metric's floor), and the store kept no reasons for them.
    """
    named = (ab or {}).get("undecided")
    if not isinstance(named, list):
        return []
    return [name for name in METRICS if name in named]


def _outcomes(run: RunRecord) -> dict[str, tuple[Outcome, str | None]]:
    # A test reported twice (a rerun) counts by its last report, as pytest's summary does.
    return {o.test_id: (o.outcome, o.message) for o in run.outcomes}


def compare_tests(anchor: RunRecord, current: RunRecord) -> dict[str, tuple[TestChange, ...]]:
    """Test outcome changes from ``anchor`` to ``current``, by category.

    newly failing: in the anchor, not failing there, failing now. fixed: failing in
    the anchor, in the run now and not failing (before and after say how). still
    failing: failing in both. new: not in the anchor. removed: not in the run now.
    """
    before, after = _outcomes(anchor), _outcomes(current)
    found: dict[str, list[TestChange]] = {
        "newly_failing": [], "fixed": [], "still_failing": [], "new_tests": [],
        "removed_tests": []}
    for test_id, (now, message) in after.items():
        if test_id not in before:
            found["new_tests"].append(TestChange(test_id, None, now, message))
            continue
        was = before[test_id][0]
        change = TestChange(test_id, was, now, message)
        if was in FAILING_OUTCOMES and now in FAILING_OUTCOMES:
            found["still_failing"].append(change)
        elif now in FAILING_OUTCOMES:
            found["newly_failing"].append(change)
        elif was in FAILING_OUTCOMES:
            found["fixed"].append(change)
    for test_id, (was, message) in before.items():
        if test_id not in after:
            found["removed_tests"].append(TestChange(test_id, was, None, message))
    return {name: tuple(sorted(changes, key=lambda c: c.test_id))
            for name, changes in found.items()}


FigureId = tuple[FigureKey, str]


def run_figures(run: RunRecord) -> dict[FigureId, float]:
    """One value per (key, metric) of ``run``: the median of its samples."""
    return {fid: value for fid, (value, _) in figure_medians(run).items()}


def compare_figures(baseline: Sequence[RunRecord], current: RunRecord,
                    rule: NoiseRule) -> tuple[FigureResult, ...]:
    """Judge each of ``current``'s figures against the same key and metric in the baseline.

    Figures are only ever compared with the same (FigureKey, metric): a key differing
    in any field is another figure.
    """
    per_run = [run_figures(run) for run in baseline]
    now = run_figures(current)
    results: list[FigureResult] = []
    for fid, value in now.items():
        key, metric = fid
        history = [values[fid] for values in per_run if fid in values]
        floor = METRICS[metric].min_change if metric in METRICS else 0.0
        judgement = judge(history, value, metric_direction(metric), rule, floor)
        results.append(FigureResult(key, metric, metric_unit(metric), value, judgement))
    gone = {fid for values in per_run for fid in values} - now.keys()
    for fid in gone:
        key, metric = fid
        history = [values[fid] for values in per_run if fid in values]
        mean = statistics.fmean(history)
        stdev = statistics.stdev(history) if len(history) >= 2 else None
        results.append(FigureResult(key, metric, metric_unit(metric), None,
                                    Judgement(FigureStatus.MISSING_NOW, len(history), mean, stdev,
                                              None, None)))
    return tuple(sorted(results, key=lambda r: (r.label, r.metric)))


def compare(baseline: Sequence[RunRecord], current: RunRecord,
            rule: NoiseRule = DEFAULT_NOISE_RULE,
            configs: Sequence[GpuConfig] = ()) -> Comparison:
    """Compare ``current`` with ``baseline`` (anchor first, then older runs).

    Tests are compared with the anchor only; figures with every baseline run that has
    them. Refuses baselines from other hardware. ``configs``: the card configs whose
    calibrated figures the run's decode speed is held against (harness/results/drift.py).
    """
    if not baseline:
        raise HarnessError(f"no baseline runs to compare run {current.run_id} with; "
                           "store a run of the baseline build first")
    for run in baseline:
        if run.hardware.identity != current.hardware.identity:
            raise HardwareMismatchError(run.hardware, current.hardware, run.run_id,
                                        current.run_id)
    tests = compare_tests(baseline[0], current)
    return Comparison(
        baseline_run_ids=tuple(run.run_id for run in baseline),
        current_run_id=current.run_id, hardware=current.hardware, rule=rule,
        figure_results=compare_figures(baseline, current, rule), ab=current.ab,
        bisect=current.bisect, tune=current.tune,
        drift=measured_drift(current, configs, rule.threshold),
        numerics=compare_numerics(baseline, current), **tests)
