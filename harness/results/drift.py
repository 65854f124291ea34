"""A run's decode speed against its card's calibrated figures (pure).

``harness calibrate --write`` records, per card, bundle and figure key, the median decode
speed over the nightly runs and its spread (harness/results/calibration.py). A later
run on that card whose decode speed moves further from that median than the spread —
and at least the history rule's relative threshold, so a calibration over near-identical
nights does not flag every wiggle — has drifted: the comparison reports it with both
values. A drift is reported, not judged: the gate's verdict stays the history rule's
and the A/B rule's.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from harness.facts.gpu import GpuConfig, MeasuredDecode
from harness.results.calibration import card_of, key_label
from harness.results.run_record import FigureKey, RunRecord


@dataclass(frozen=True)
class Drift:
    card: str
    key: FigureKey
    measured: MeasuredDecode
    #: The run's decode tokens/s (the median of its samples for this key).
    current: float

    @property
    def change(self) -> float:
        return (self.current - self.measured.median) / self.measured.median


def measured_drift(current: RunRecord, configs: Sequence[GpuConfig],
                   threshold: float) -> tuple[Drift, ...]:
    """The decode figures of ``current`` that left their card's calibrated band."""
    card = card_of(current, configs)
    if card is None or not card.measured_decode:
        return ()
    samples: dict[FigureKey, list[float]] = {}
    for figure in current.figures:
        if figure.metric == "decode_tps":
            samples.setdefault(figure.key, []).append(figure.value)
    found = []
    for key, values in sorted(samples.items(), key=lambda item: key_label(item[0])):
        measured = card.measured_decode.get((key.fixture, key_label(key)))
        if measured is None or measured.median <= 0:
            continue
        value = statistics.median(values)
        if abs(value - measured.median) / measured.median > max(measured.spread, threshold):
            found.append(Drift(card.name, key, measured, value))
    return tuple(found)
