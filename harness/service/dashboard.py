"""What the performance dashboard draws (pure): one series per figure key and metric.

A page is one branch on one hardware (``Hardware.identity``). For every (FigureKey,
metric) its runs measured, a series holds one point per run, oldest first: the run's
median of that figure (as ``harness compare`` takes it), its median prediction where the
run recorded one (harness/planning/decode_speed.py), the A/B verdict of that metric when
the run has an A/B result ("undecided" for a metric that left the A/B undecided, never
read as a pass), and the history rule's judgement against the ``window`` runs
before it — the gate's own :func:`harness.results.noise_rule.judge` — with the band of
values that rule lets pass: the window's mean ± the largest of the relative threshold,
``z`` standard deviations and the metric's absolute floor.

Each series has an id (:func:`series_id`) that names it in URLs: the same figure key and
metric give the same id in every process and on every night, so a series keeps its
name while its runs change.

An :class:`IndexRow` is one line of the index: a branch and hardware pair with runs
(harness/service/dashboard_reads.py counts them in the store).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass

from harness.facts.commit_ids import short_commit
from harness.results.comparison import undecided_of
from harness.results.noise_rule import DEFAULT_NOISE_RULE, NoiseRule, judge
from harness.results.rules import NOISE_WINDOW, FigureStatus
from harness.results.run_record import METRICS, FigureKey, Metric, RunRecord, figure_medians


@dataclass(frozen=True)
class DashboardPoint:
    run_id: str
    started_at: str
    commit: str
    value: float
    #: The bandwidth model's figure for this run, None when the run recorded none.
    predicted: float | None
    #: The values the history rule lets pass here (low, high); None with too few runs.
    band: tuple[float, float] | None
    status: FigureStatus
    #: The run's A/B verdict on this metric (``harness ab --record``), None without one;
    #: "undecided" where the metric left the A/B undecided (its verdict ``unknown``).
    ab_verdict: str | None
    #: The run's bisect in a few words ("first bad 1a2b3c4d5e6f"), None without one.
    bisect: str | None = None


@dataclass(frozen=True)
class DashboardSeries:
    key: FigureKey
    metric: Metric
    points: tuple[DashboardPoint, ...]

    @property
    def ident(self) -> str:
        return series_id(self.key, self.metric.name)

    @property
    def changed(self) -> bool:
        """Whether the history rule called any of these runs regressed or improved."""
        return any(p.status in _CHANGES for p in self.points)

    @property
    def title(self) -> str:
        k = self.key
        return (f"{self.metric.name} ({self.metric.unit}) · {k.fixture} · {k.backend} · "
                f"ngl {k.n_gpu_layers} · K/V {k.cache_type_k}/{k.cache_type_v} · "
                f"fa {k.flash_attn} · offload {k.offload} · {k.n_prompt}+{k.n_gen} tokens")


@dataclass(frozen=True)
class IndexRow:
    branch: str
    hardware: str
    description: str
    runs: int
    latest: str


@dataclass(frozen=True)
class BisectNote:
    """A run's bisect (``harness bisect --record``), beside the regression it explains."""

    run_id: str
    started_at: str
    #: "first bad commit <sha> <subject>", or the candidates, or "not reproduced".
    finding: str
    oracle: str


def bisect_notes(runs_newest_first: Sequence[RunRecord]) -> tuple[BisectNote, ...]:
    """The runs that carry a bisect, newest first, each in one line (pure)."""
    notes = []
    for run in runs_newest_first:
        found = run.bisect
        if found is None:
            continue
        first_bad, candidates = found.get("first_bad"), found.get("candidates") or []
        if not found.get("reproduced"):
            finding = "not reproduced: the endpoints judged alike"
        elif isinstance(first_bad, dict):
            finding = f"first bad commit {first_bad['sha']} {first_bad['subject']}"
        else:
            finding = (f"one of {len(candidates)} commits: "
                       + ", ".join(short_commit(str(c["sha"])) for c in candidates[:8])
                       + (" …" if len(candidates) > 8 else ""))
        notes.append(BisectNote(run.run_id, run.started_at, finding, str(found["oracle"])))
    return tuple(notes)


def bisect_mark(run: RunRecord) -> str | None:
    """The run's bisect as a plot writes it at the run (pure): its culprit's short id,
    how many candidates are left, or that it did not reproduce; None without one."""
    found = run.bisect
    if found is None:
        return None
    first_bad = found.get("first_bad")
    if not found.get("reproduced"):
        return "not reproduced"
    if isinstance(first_bad, dict):
        return f"first bad {short_commit(str(first_bad['sha']))}"
    return f"{len(found.get('candidates') or [])} candidates"


@dataclass(frozen=True)
class TuneNote:
    """A run's tune of its card (``harness tune --record`` or ``--check``)."""

    run_id: str
    started_at: str
    card: str
    stale: bool
    #: "ubatch 256 beat the plan: prompt_tps x3.8 [2.9, 4.4]", or the plan holds.
    finding: str


def tune_notes(runs_newest_first: Sequence[RunRecord]) -> tuple[TuneNote, ...]:
    """The runs that carry a tune, newest first, each in one line (pure)."""
    notes = []
    for run in runs_newest_first:
        tune = run.tune
        if tune is None:
            continue
        winner = tune.get("winner")
        if isinstance(winner, dict):
            figures = ", ".join(
                f"{f['metric']} x{f['ratio']:.3f} [{f['low']:.3f}, {f['high']:.3f}]"
                for f in winner["figures"] if f["verdict"] == "improved"
                and f["ratio"] is not None and f["low"] is not None and f["high"] is not None)
            finding = (f"stale: {winner['name']} ({'; '.join(winner['differs'])}) beat "
                       f"the plan for {tune['key']} at context {tune['context']}: {figures}")
        else:
            finding = f"the plan for {tune['key']} at context {tune['context']} holds"
        notes.append(TuneNote(run.run_id, run.started_at, str(tune["card"]),
                              bool(tune["stale"]), finding))
    return tuple(notes)


#: The statuses "changed only" keeps a series for.
_CHANGES = frozenset({FigureStatus.REGRESSED, FigureStatus.IMPROVED})


def series_id(key: FigureKey, metric: str) -> str:
    """16 hex digits naming the series of ``key`` and ``metric``, the same everywhere."""
    # vars(), not asdict(): the key's fields are flat, and asdict's deep copy made this
    # the most of building a page of 24,000 series.
    text = json.dumps([vars(key), metric], sort_keys=True, ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()[:16]


def dashboard_series(runs_oldest_first: Sequence[RunRecord],
                     rule: NoiseRule = DEFAULT_NOISE_RULE,
                     window: int = NOISE_WINDOW) -> tuple[DashboardSeries, ...]:
    """Every figure key and metric of these runs, each a series over the runs."""
    values: dict[tuple[FigureKey, str], list[tuple[RunRecord, float, float | None]]] = {}
    for run in runs_oldest_first:
        for fid, (value, predicted) in figure_medians(run).items():
            values.setdefault(fid, []).append((run, value, predicted))
    series = []
    for (key, name), measured in values.items():
        metric = METRICS.get(name)
        if metric is None:
            continue
        points = []
        for i, (run, value, predicted) in enumerate(measured):
            baseline = [v for _, v, _ in measured[max(0, i - window):i]]
            judged = judge(baseline, value, metric.direction, rule, metric.min_change)
            points.append(DashboardPoint(
                run_id=run.run_id, started_at=run.started_at, commit=run.commit,
                value=value, predicted=predicted,
                band=_band(judged.mean, judged.stdev, judged.n, rule, metric),
                status=judged.status, ab_verdict=_ab_verdict(run, name),
                bisect=bisect_mark(run)))
        series.append(DashboardSeries(key, metric, tuple(points)))
    return tuple(sorted(series, key=lambda s: (s.key.fixture, s.metric.name, repr(s.key))))


def _band(mean: float | None, stdev: float | None, n: int, rule: NoiseRule,
          metric: Metric) -> tuple[float, float] | None:
    if mean is None or stdev is None or n < rule.min_runs:
        return None
    reach = max(rule.threshold * abs(mean), rule.z * stdev, metric.min_change)
    return max(0.0, mean - reach), mean + reach


#: What the dashboard writes for a metric that left its run's A/B undecided.
UNDECIDED = "undecided"


def _ab_verdict(run: RunRecord, metric: str) -> str | None:
    metrics = (run.ab or {}).get("metrics")
    entry = metrics.get(metric) if isinstance(metrics, dict) else None
    verdict = entry.get("verdict") if isinstance(entry, dict) else None
    if not isinstance(verdict, str):
        return None
    # undecided_of is empty for a regressed A/B: there an unknown stays "unknown".
    return UNDECIDED if metric in undecided_of(run.ab) else verdict
