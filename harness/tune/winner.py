"""Which measured candidate beats the current plan, if any (pure).

A candidate wins only on verdicts: at least one figure ``improved`` against the current
plan (its whole interval beyond the threshold band, harness/ab/decision.py) and none
``regressed``. A figure still ``unknown`` when the budget ran out counts for nothing
either way, so overlapping intervals never make a winner: then "the current plan
holds". Among winners the fastest is the one whose improved figures' worst-case gains
(the interval's near end, turned so that above 1 is faster) multiply to the most.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.ab.decision import MetricDecision
from harness.results.rules import AbVerdict
from harness.results.run_record import Direction, metric_direction
from harness.tune.candidates import Candidate


@dataclass(frozen=True)
class Measured:
    """One candidate's comparison with the current plan (or why it has none)."""

    candidate: Candidate
    decisions: tuple[MetricDecision, ...] = ()
    #: The comparison failed (a server refused the launch, crashed, hung): its message.
    error: str | None = None
    elapsed_s: float = 0.0
    #: Every sample's values, ``{"arm", "pair", "values"}`` each (for ``--json``).
    samples: tuple[dict[str, object], ...] = ()

    @property
    def improved(self) -> tuple[MetricDecision, ...]:
        return tuple(d for d in self.decisions if d.verdict is AbVerdict.IMPROVED)

    @property
    def regressed(self) -> tuple[MetricDecision, ...]:
        return tuple(d for d in self.decisions if d.verdict is AbVerdict.REGRESSED)

    @property
    def better(self) -> bool:
        return self.error is None and bool(self.improved) and not self.regressed

    @property
    def verdict(self) -> str:
        if self.error is not None:
            return "failed"
        if self.better:
            return "better"
        if self.regressed:
            return "worse"
        if self.decisions and all(d.verdict is AbVerdict.UNCHANGED for d in self.decisions):
            return "same"
        return "undecided" if not self.improved else "mixed"


def worst_case_gain(decision: MetricDecision) -> float:
    """The interval's end nearest "no change", as a speed-up (above 1: faster)."""
    interval = decision.interval
    if interval is None:
        return 1.0
    if metric_direction(decision.metric, "tune") is Direction.HIGHER_IS_BETTER:
        return interval.low
    return 1.0 / interval.high if interval.high > 0 else 1.0


def gain(measured: Measured) -> float:
    product = 1.0
    for decision in measured.improved:
        product *= worst_case_gain(decision)
    return product


@dataclass(frozen=True)
class TuneVerdict:
    winner: Measured | None
    #: Every candidate better than the current plan, fastest first.
    better: tuple[Measured, ...]
    summary: str

    @property
    def holds(self) -> bool:
        return self.winner is None


def judge(measured: Sequence[Measured], threshold: float) -> TuneVerdict:
    better = sorted((m for m in measured if m.better), key=lambda m: -gain(m))
    if not better:
        tried = sum(1 for m in measured if m.error is None)
        return TuneVerdict(None, (), (
            f"the current plan holds: none of the {tried} candidates measured was faster "
            f"by more than {threshold:.0%} with its whole interval, without a figure "
            "slower"))
    winner = better[0]
    figures = ", ".join(
        f"{d.metric} x{worst_case_gain(d):.3f} or more" for d in winner.improved)
    return TuneVerdict(winner, tuple(better), (
        f"{winner.candidate.name} beats the current plan ({'; '.join(winner.candidate.differs)}): "
        f"{figures}"))
