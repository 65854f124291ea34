"""Which A/B designs a runner has shown to see a change, and what that allows (pure).

A design that runs both arms at once (duet) shares the machine between them: caches,
memory bandwidth, a GPU. On such a runner one arm's slowdown can slow the other too, and
the pair's ratio then shrinks a real change towards 1 — "unchanged" with a confident
interval. The sequential design (harness/ab/design.py) measures each arm alone and is
the ground truth; any other design is trusted for a metric only where a calibration on
this runner (``harness ab --calibrate-design``) injected a known change and the design
measured it within ``EFFECT_TOLERANCE`` of what the sequential design measured.

So "unchanged" must be earned: for a design not validated for a metric here, an
"unchanged" becomes "unknown" with the reason; "regressed" and "improved" stand (a
compressed effect that still clears the band was real). The validation is kept per host
(``ValidationRecord``, a JSON file in the harness cache, with its date).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from harness.ab.decision import AbVerdict, MetricDecision
from harness.ab.design import ALTERNATING, DESIGNS, DUET, INTERLEAVED, SEQUENTIAL
from harness.facts.build import Backend

#: A design keeps effect sizes when its measured effect is within this share of the
#: sequential design's: 0.2 is ±20 % (a true 10 % slowdown measured as 8 to 12 %).
EFFECT_TOLERANCE = 0.2
#: ``--design auto``'s preference among validated designs: the fastest to decide first.
AUTO_ORDER = (ALTERNATING, DUET, INTERLEAVED, SEQUENTIAL)


def effect(ratio: float, higher_is_better: bool) -> float:
    """The relative slowdown a candidate/baseline ratio says (0.1: 10 % slower)."""
    return 1.0 - ratio if higher_is_better else 1.0 - 1.0 / ratio


def keeps_effect(design_effect: float, solo_effect: float,
                 tolerance: float = EFFECT_TOLERANCE) -> bool:
    """Whether a design's measured effect is within ``tolerance`` of the solo one.

    A solo effect that is not a slowdown at all (at most 0) validates nothing: there was
    no change to see.
    """
    if solo_effect <= 0:
        return False
    return abs(design_effect / solo_effect - 1.0) <= tolerance


@dataclass(frozen=True)
class DesignCheck:
    """One design's measurement of one injected change, beside the solo one."""

    design: str
    metric: str
    solo_effect: float
    design_effect: float
    pairs: int

    @property
    def keeps(self) -> bool:
        return keeps_effect(self.design_effect, self.solo_effect)

    @property
    def share(self) -> float:
        """The design's effect as a share of the solo one (1.0: exactly kept)."""
        return self.design_effect / self.solo_effect if self.solo_effect else 0.0


@dataclass(frozen=True)
class ValidationRecord:
    """What a calibration on one host showed: per design, the metrics it keeps."""

    host: str
    date: str
    #: The builds the known change was injected between (baseline, candidate).
    builds: tuple[str, str]
    checks: tuple[DesignCheck, ...]

    def validated(self, design: str) -> frozenset[str]:
        """The metrics ``design`` is trusted for here (sequential: every one)."""
        return frozenset(c.metric for c in self.checks if c.design == design and c.keeps)

    def to_json(self) -> dict[str, object]:
        return {"host": self.host, "date": self.date, "builds": list(self.builds),
                "checks": [dataclasses.asdict(c) for c in self.checks]}


def validated_metrics(design: str, metrics: Sequence[str],
                      record: ValidationRecord | None) -> frozenset[str]:
    """The ``metrics`` whose "unchanged" ``design`` may say on this host."""
    if design == SEQUENTIAL:
        return frozenset(metrics)  # the ground truth validates itself
    if record is None:
        return frozenset()
    return record.validated(design) & frozenset(metrics)


def record_for(record: ValidationRecord | None,
               backends: Sequence[Backend | None]) -> ValidationRecord | None:
    """The record a comparison of builds of ``backends`` may use: the calibration injects
    its change into CPU builds, so it says nothing of a GPU; GPU builds (or images whose
    backend is not known) trust the sequential design alone, never running two servers on
    one GPU at once."""
    return record if all(backend is Backend.CPU for backend in backends) else None


def auto_design(metrics: Sequence[str], record: ValidationRecord | None,
                host_processes: bool) -> str:
    """``--design auto``: the first of AUTO_ORDER validated here for every metric, else
    sequential; interleaved where an arm is an image (no host process to pin)."""
    if not host_processes:
        return INTERLEAVED
    for design in AUTO_ORDER:
        if validated_metrics(design, metrics, record) == frozenset(metrics):
            return design
    return SEQUENTIAL


#: What an unearned "unchanged" tells the user to do.
CALIBRATE_HINT = ("validate it with `harness ab --calibrate-design`, or use --design "
                  "sequential (the default without a validation)")


def earn_unchanged(decision: MetricDecision, design: str, validated: frozenset[str],
                   hint: str = CALIBRATE_HINT) -> MetricDecision:
    """``decision``, or "unknown" saying why when it is an unearned "unchanged"."""
    if decision.verdict is not AbVerdict.UNCHANGED or decision.metric in validated:
        return decision
    return dataclasses.replace(
        decision, verdict=AbVerdict.UNKNOWN,
        reason=(f"the interval lies in the band, but the {design} design was not shown to "
                f"see a change of {decision.metric} on this runner; {hint}"))


def record_from_json(body: Mapping[str, object]) -> ValidationRecord:
    """A record as :meth:`ValidationRecord.to_json` wrote it; ValueError when it is not."""
    try:
        checks = body["checks"]
        builds = body["builds"]
        if not isinstance(checks, list) or not isinstance(builds, list) or len(builds) != 2:
            raise TypeError("checks and builds must be lists (builds of two)")
        parsed = tuple(DesignCheck(design=str(c["design"]), metric=str(c["metric"]),
                                   solo_effect=float(c["solo_effect"]),
                                   design_effect=float(c["design_effect"]),
                                   pairs=int(c["pairs"])) for c in checks)
        if any(c.design not in DESIGNS for c in parsed):
            raise ValueError(f"a check names a design outside {DESIGNS}")
        return ValidationRecord(host=str(body["host"]), date=str(body["date"]),
                                builds=(str(builds[0]), str(builds[1])), checks=parsed)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"not a design validation record: {exc}") from exc
