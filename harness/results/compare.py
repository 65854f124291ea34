"""Compare a run with its baseline: which tests broke, which figures moved beyond noise.

Everything here is pure except :func:`select_baseline`, which reads the store. The
noise rule is :func:`judge`, kept small and cheap so benchmarks can simulate its
false-alarm and detection rates directly.

A run may also carry its own paired A/B result (``RunRecord.ab``, from ``harness ab
--record``): two builds measured side by side, decided by its own rule rather than
against history. The comparison shows it as is, and a metric it calls regressed fails
the comparison as a regressed figure does.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.errors import ConfigError, HarnessError
from harness.results.model import (
    FAILING_OUTCOMES,
    METRICS,
    Direction,
    FigureKey,
    Hardware,
    RunRecord,
    metric_direction,
)
from harness.results.rules import (
    IMPROVED,
    NOISE_MIN_RUNS,
    NOISE_THRESHOLD,
    NOISE_Z,
    REGRESSED,
    UNCHANGED,
)
from harness.results.store import ResultsStore

# Figure statuses: the verdicts of harness/results/rules.py, and two of the history's own.
NO_BASELINE = "no baseline"
MISSING_NOW = "missing now"


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
class Judgement:
    """The verdict on one figure and the numbers behind it."""

    status: str
    n: int
    mean: float | None
    stdev: float | None
    #: (current - mean) / mean, signed; None without a baseline.
    change: float | None
    #: |current - mean| / stdev; inf when the baseline never varied and current differs.
    z: float | None


def judge(baseline_values: Sequence[float], current: float, direction: Direction,
          rule: NoiseRule = NoiseRule(), min_change: float = 0.0) -> Judgement:
    """Is ``current`` a regression, an improvement or noise against ``baseline_values``?

    ``min_change`` is the metric's absolute floor (``Metric.min_change``): a move smaller
    than it never counts, whatever its relative size and z.
    """
    n = len(baseline_values)
    mean = statistics.fmean(baseline_values) if n else None
    stdev = statistics.stdev(baseline_values) if n >= 2 else None
    if n < rule.min_runs or mean is None or stdev is None:
        return Judgement(NO_BASELINE, n, mean, stdev, None, None)
    if mean != 0:
        change = (current - mean) / mean
    else:
        change = 0.0 if current == 0 else math.copysign(math.inf, current)
    spread = abs(current - mean)
    # A baseline that never varied makes any difference infinitely many stdevs away.
    z = spread / stdev if stdev > 0 else (math.inf if spread else 0.0)
    worsening = change if direction is Direction.LOWER_IS_BETTER else -change
    status = UNCHANGED
    if z > rule.z and spread >= min_change:
        if worsening > rule.threshold:
            status = REGRESSED
        elif -worsening > rule.threshold:
            status = IMPROVED
    return Judgement(status, n, mean, stdev, change, z)


@dataclass(frozen=True)
class TestChange:
    """A test's outcome in the anchor baseline run and now (None: not in that run)."""

    test_id: str
    before: str | None
    after: str | None
    message: str | None = None


@dataclass(frozen=True)
class FigureResult:
    key: FigureKey
    metric: str
    unit: str
    #: None when the figure is only in the baseline (status "missing now").
    current: float | None
    judgement: Judgement

    @property
    def status(self) -> str:
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

    def figures_with(self, status: str) -> list[FigureResult]:
        return [r for r in self.figure_results if r.status == status]

    @property
    def regressions(self) -> list[FigureResult]:
        return self.figures_with(REGRESSED)

    @property
    def improvements(self) -> list[FigureResult]:
        return self.figures_with(IMPROVED)

    @property
    def ab_regressions(self) -> list[str]:
        """Metrics the current run's A/B result calls regressed, in METRICS order."""
        return [name for name, m in _ab_metrics(self.ab) if m["verdict"] == REGRESSED]

    @property
    def regressed(self) -> bool:
        # An A/B regression counts like a figure's: both say the candidate build is
        # slower, and `harness compare` exits 1 on either.
        return bool(self.newly_failing) or bool(self.regressions) or bool(self.ab_regressions)

    def to_json(self) -> dict[str, Any]:
        """JSON-ready form; non-finite numbers (a z over a flat baseline) as "inf"."""
        return _comparison_json(self)

    def to_markdown(self) -> str:
        """A GitHub-flavoured summary, e.g. for ``$GITHUB_STEP_SUMMARY``."""
        return _comparison_markdown(self)


def _outcomes(run: RunRecord) -> dict[str, tuple[str, str | None]]:
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
    samples: dict[FigureId, list[float]] = {}
    for figure in run.figures:
        samples.setdefault((figure.key, figure.metric), []).append(figure.value)
    return {fid: statistics.median(values) for fid, values in samples.items()}


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
        results.append(FigureResult(key, metric, _unit(metric), value, judgement))
    gone = {fid for values in per_run for fid in values} - now.keys()
    for fid in gone:
        key, metric = fid
        history = [values[fid] for values in per_run if fid in values]
        mean = statistics.fmean(history)
        stdev = statistics.stdev(history) if len(history) >= 2 else None
        results.append(FigureResult(key, metric, _unit(metric), None,
                                    Judgement(MISSING_NOW, len(history), mean, stdev,
                                              None, None)))
    return tuple(sorted(results, key=lambda r: (r.label, r.metric)))


def _ab_metrics(ab: dict[str, Any] | None) -> list[tuple[str, dict[str, Any]]]:
    """The A/B result's metrics in METRICS order (the store keeps them sorted by name)."""
    if ab is None:
        return []
    found: dict[str, dict[str, Any]] = ab["metrics"]
    return [(name, found[name]) for name in METRICS if name in found]


def _unit(metric: str) -> str:
    known = METRICS.get(metric)
    return known.unit if known else ""


def compare(baseline: Sequence[RunRecord], current: RunRecord,
            rule: NoiseRule = NoiseRule()) -> Comparison:
    """Compare ``current`` with ``baseline`` (anchor first, then older runs).

    Tests are compared with the anchor only; figures with every baseline run that has
    them. Refuses baselines from other hardware.
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
        figure_results=compare_figures(baseline, current, rule), ab=current.ab, **tests)


# -- choosing the baseline -----------------------------------------------------

def _unknown_selector(store: ResultsStore, selector: str) -> HarnessError:
    branches = store.branches(limit=8)
    latest = [run.run_id for run in store.list_runs(limit=5)]
    if not latest:
        return HarnessError(f"baseline {selector!r}: the results store at "
                            f"{store.url_for_display} holds no runs yet; store a run of "
                            "the baseline build first")
    return HarnessError(
        f"baseline {selector!r} is neither `latest`, a stored run id nor a branch with "
        f"stored runs in {store.url_for_display}; branches: {', '.join(branches)}; "
        f"newest runs: {', '.join(latest)}")


def _older_than(store: ResultsStore, current: RunRecord, *, hardware: str,
                limit: int) -> list[RunRecord]:
    """Runs on ``hardware`` older than ``current`` (all of them when it is not stored)."""
    if store.get_run(current.run_id) is not None:
        return store.list_runs(hardware=hardware, before_run=current.run_id, limit=limit)
    found = store.list_runs(hardware=hardware, limit=limit + 1)
    return [run for run in found if run.run_id != current.run_id][:limit]


def _anchor(store: ResultsStore, selector: str, current: RunRecord) -> RunRecord:
    identity = current.hardware.identity
    if selector == "latest":
        found = _older_than(store, current, hardware=identity, limit=1)
        if not found:
            raise HarnessError(
                f"baseline `latest`: no run older than {current.run_id} on "
                f"{current.hardware.describe()} in {store.url_for_display}; store a "
                "baseline run on this hardware first, or name a run id")
        return found[0]
    by_id = store.get_run(selector)
    if by_id is not None:
        if by_id.run_id == current.run_id:
            raise HarnessError(f"baseline {selector!r} is the run being compared; pick "
                               "an earlier run, a branch or `latest`")
        if by_id.hardware.identity != identity:
            raise HardwareMismatchError(by_id.hardware, current.hardware, by_id.run_id,
                                        current.run_id)
        return by_id
    on_branch = [run for run in store.list_runs(branch=selector, hardware=identity, limit=2)
                 if run.run_id != current.run_id]
    if on_branch:
        return on_branch[0]
    # The branch exists but only elsewhere (or only as the current run itself).
    elsewhere = [run for run in store.list_runs(branch=selector, limit=2)
                 if run.run_id != current.run_id]
    if elsewhere:
        raise HardwareMismatchError(elsewhere[0].hardware, current.hardware,
                                    elsewhere[0].run_id, current.run_id)
    if store.latest_run(branch=selector) is not None:
        raise HarnessError(f"baseline branch {selector!r} has no run other than "
                           f"{current.run_id} itself; store a baseline run first")
    raise _unknown_selector(store, selector)


def select_baseline(store: ResultsStore, selector: str, current: RunRecord,
                    window: int = 5) -> list[RunRecord]:
    """The anchor run ``selector`` names, then up to ``window - 1`` runs before it.

    ``selector``: ``latest`` (the newest stored run older than ``current`` on its
    hardware, any branch), a run id, or a branch name (its newest run on ``current``'s
    hardware). The runs before the anchor come from the anchor's branch and hardware.
    """
    if window < 1:
        raise ConfigError(f"baseline window {window} must be at least 1")
    anchor = _anchor(store, selector, current)
    preceding = store.list_runs(branch=anchor.branch, hardware=anchor.hardware.identity,
                                before_run=anchor.run_id, limit=window)
    preceding = [run for run in preceding if run.run_id != current.run_id]
    return [anchor, *preceding[:window - 1]]


# -- rendering -------------------------------------------------------------------

_TEST_CATEGORIES = (
    ("newly_failing", "Newly failing tests"),
    ("fixed", "Fixed tests"),
    ("still_failing", "Still failing tests"),
    ("new_tests", "New tests"),
    ("removed_tests", "Removed tests"),
)

#: Longest failure message a markdown table cell shows.
_MESSAGE_CHARS = 160
#: Longest counter value shown (a greedy completion's text can run to pages).
_COUNTER_CHARS = 80


def _finite_or_text(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "inf" if value > 0 else "-inf"


def _change_json(change: TestChange) -> dict[str, Any]:
    return {"test_id": change.test_id, "before": change.before, "after": change.after,
            "message": change.message}


def _figure_json(result: FigureResult) -> dict[str, Any]:
    j = result.judgement
    return {
        "key": asdict(result.key), "label": result.label, "metric": result.metric,
        "unit": result.unit, "status": result.status, "baseline_runs": j.n,
        "baseline_mean": j.mean, "baseline_stdev": j.stdev, "current": result.current,
        "change": _finite_or_text(j.change),
        "change_percent": _finite_or_text(None if j.change is None else j.change * 100),
        "z": _finite_or_text(j.z),
    }


def _comparison_json(c: Comparison) -> dict[str, Any]:
    statuses = (REGRESSED, IMPROVED, UNCHANGED, NO_BASELINE, MISSING_NOW)
    return {
        "regressed": c.regressed,
        "verdict": "regressed" if c.regressed else "ok",
        "current_run": c.current_run_id,
        "baseline_runs": list(c.baseline_run_ids),
        "hardware": {**asdict(c.hardware), "identity": c.hardware.identity,
                     "description": c.hardware.describe()},
        "rule": asdict(c.rule),
        "tests": {name: [_change_json(t) for t in getattr(c, name)]
                  for name, _ in _TEST_CATEGORIES},
        "figures": [_figure_json(r) for r in c.figure_results],
        "figure_counts": {s: len(c.figures_with(s)) for s in statuses},
        # As the run record holds it (every number finite, the schema saw to that).
        "ab": c.ab,
    }


def _cell(text: str | None, limit: int = _MESSAGE_CHARS) -> str:
    if text is None:
        return "—"
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[:limit - 1] + "…"
    return flat.replace("|", "\\|")


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "∞" if value > 0 else "-∞"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _percent(change: float | None) -> str:
    if change is None:
        return "—"
    if not math.isfinite(change):
        return _num(change)
    return f"{change * 100:+.1f} %"


def _headline(c: Comparison) -> str:
    if not c.regressed:
        return "## ✅ No regression"
    parts = []
    if c.newly_failing:
        parts.append(f"{len(c.newly_failing)} newly failing test"
                     f"{'s' if len(c.newly_failing) != 1 else ''}")
    if c.regressions:
        parts.append(f"{len(c.regressions)} figure regression"
                     f"{'s' if len(c.regressions) != 1 else ''}")
    if c.ab_regressions:
        parts.append(f"A/B regression in {', '.join(c.ab_regressions)}")
    return f"## ❌ Regressed: {', '.join(parts)}"


def _test_table(changes: Sequence[TestChange]) -> list[str]:
    lines = ["| Test | Before | Now | Message |", "| --- | --- | --- | --- |"]
    lines += [f"| `{_cell(t.test_id)}` | {t.before or '—'} | {t.after or '—'} | "
              f"{_cell(t.message)} |" for t in changes]
    return lines


def _figure_table(results: Sequence[FigureResult]) -> list[str]:
    lines = ["| Figure | Metric | Baseline mean ± stdev (runs) | Now | Change | z |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        j = r.judgement
        unit = f" {r.unit}" if r.unit else ""
        lines.append(f"| {_cell(r.label)} | {r.metric} | {_num(j.mean)} ± {_num(j.stdev)}"
                     f"{unit} ({j.n}) | {_num(r.current)}{unit} | {_percent(j.change)} | "
                     f"{_num(j.z)} |")
    return lines


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _ab_section(ab: dict[str, Any], regressed: Sequence[str]) -> list[str]:
    """The "Performance A/B" section: per metric ratio and CI, then changed counters."""
    threshold: float = ab["threshold"]
    title = "### Performance A/B" + (f": ❌ regressed ({', '.join(regressed)})"
                                     if regressed else "")
    lines = [
        "", title, "",
        f"Candidate `{_cell(ab['candidate'])}` against baseline `{_cell(ab['baseline'])}`, "
        f"measured side by side ({ab['design']} design). Ratio is candidate / baseline; "
        f"regressed (or improved) when the whole 95 % interval is more than "
        f"{threshold * 100:g} % worse (or better), unchanged when it lies within "
        f"{threshold * 100:g} %, unknown when the budget ran out first.", "",
        "| Metric | Ratio | 95 % CI | Pairs | Verdict |", "| --- | --- | --- | --- | --- |",
    ]
    for name, m in _ab_metrics(ab):
        unit = f" ({_unit(name)})" if _unit(name) else ""
        interval = ("—" if m["ci_low"] is None or m["ci_high"] is None
                    else f"[{_ratio(m['ci_low'])}, {_ratio(m['ci_high'])}]")
        verdict = f"**{m['verdict']}**" if m["verdict"] == REGRESSED else m["verdict"]
        lines.append(f"| {name}{unit} | {_ratio(m['ratio'])} | {interval} | {m['pairs']} | "
                     f"{verdict} |")
    changes: list[dict[str, str]] = ab["counter_changes"]
    if not changes:
        lines += ["", "No deterministic counter changed."]
        return lines
    lines += ["", f"Deterministic counters that changed ({len(changes)}):", "",
              "| Counter | Baseline | Candidate |", "| --- | --- | --- |"]
    lines += [f"| `{_cell(ch['name'])}` | {_cell(ch['baseline'], _COUNTER_CHARS)} | "
              f"{_cell(ch['candidate'], _COUNTER_CHARS)} |" for ch in changes]
    return lines


def _comparison_markdown(c: Comparison) -> str:
    anchor, *older = c.baseline_run_ids
    rule = c.rule
    lines = [
        _headline(c), "",
        f"Run `{c.current_run_id}` against baseline `{anchor}`"
        + (f" and {len(older)} earlier run{'s' if len(older) != 1 else ''} "
           f"({', '.join(f'`{r}`' for r in older)})" if older else "")
        + f", on {c.hardware.describe()}.", "",
        f"A figure counts as moved when it is more than {rule.threshold * 100:g} % and "
        f"more than {rule.z:g} standard deviations from the mean of at least "
        f"{rule.min_runs} baseline runs, and more than its metric's absolute floor "
        f"(timings and memory); tests compare with `{anchor}` alone.",
    ]
    for name, title in _TEST_CATEGORIES:
        changes: tuple[TestChange, ...] = getattr(c, name)
        if changes:
            lines += ["", f"### {title} ({len(changes)})", "", *_test_table(changes)]
    for status, title in ((REGRESSED, "Figure regressions"), (IMPROVED, "Figure improvements")):
        found = c.figures_with(status)
        if found:
            lines += ["", f"### {title} ({len(found)})", "", *_figure_table(found)]
    counts = [f"{len(c.figures_with(UNCHANGED))} unchanged",
              f"{len(c.figures_with(NO_BASELINE))} without a baseline "
              f"(fewer than {rule.min_runs} baseline runs)"]
    if c.figures_with(MISSING_NOW):
        counts.append(f"{len(c.figures_with(MISSING_NOW))} in the baseline but missing now")
    lines += ["", f"Figures: {', '.join(counts)}."]
    if c.ab is not None:
        lines += _ab_section(c.ab, c.ab_regressions)
    return "\n".join(lines) + "\n"
