"""Per-card figures measured over nightly runs (``harness calibrate``), pure.

A run belongs to a card only through what it measured: its ``hardware.gpu`` matched by
the card config's ``match`` patterns (a run without a GPU — a CPU runner — is matched by
its CPU model, so a config can describe a CPU runner too). For each card, bundle (the
figure key's ``fixture``: a fixture's or a bundle's model) and figure key, the runs'
medians of each figure give:

- ``decode_tps``: the median over runs and its spread (the relative interquartile
  range, (p75 - p25) / median);
- ``ttft_p50_ms`` / ``ttft_p95_ms``: the 50th and 95th percentiles over runs of the
  time to first token;
- ``decode_efficiency``: the efficiency the bandwidth model would need to predict the
  measured speed (its assumed efficiency x measured / predicted), where the runs
  recorded a prediction.

:func:`measured_section` turns the rows of one card into the ``measured`` object of its
config (schema: configs/gpu/schema.json), each entry with
``"_provenance": "measured"`` and the run ids, first and last dates and harness versions
behind it; groups with fewer than ``min_runs`` runs are left out.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from harness.facts.gpu import GpuConfig
from harness.planning.autotune import match_config
from harness.planning.decode_speed import GPU_EFFICIENCY, HOST_EFFICIENCY
from harness.results.run_record import FigureKey, RunRecord, figure_medians

PROVENANCE = "measured"


@dataclass(frozen=True)
class Sample:
    run_id: str
    started_at: str
    harness_version: str
    value: float
    predicted: float | None


@dataclass(frozen=True)
class CalibrationRow:
    card: str
    bundle: str
    key: FigureKey
    metric: str
    measured: float
    #: Relative spread over the runs (decode_tps: IQR / median); None for percentiles.
    spread: float | None
    samples: tuple[Sample, ...]
    #: The config's extrapolated value beside it (decode_tps: ``tokens_per_second_decode``).
    extrapolated: float | None

    @property
    def runs(self) -> int:
        return len(self.samples)

    @property
    def change(self) -> float | None:
        """Measured against extrapolated, relative (+0.10: 10 % above the config)."""
        if not self.extrapolated:
            return None
        return (self.measured - self.extrapolated) / self.extrapolated


def card_of(run: RunRecord, configs: Sequence[GpuConfig]) -> GpuConfig | None:
    """The card config whose ``match`` finds the run's GPU (else its CPU model)."""
    hardware = run.hardware
    return match_config(hardware.gpu if hardware.has_gpu else hardware.cpu, configs)


def key_label(key: FigureKey) -> str:
    """A figure key without its fixture, as a config's ``measured`` entries are named."""
    return (f"{key.backend}/ngl-{key.n_gpu_layers}/kv-{key.cache_type_k}-{key.cache_type_v}"
            f"/fa-{key.flash_attn}/offload-{key.offload or 'none'}/{key.n_prompt}+{key.n_gen}")


def calibrate(runs: Iterable[RunRecord],
              configs: Sequence[GpuConfig]) -> tuple[CalibrationRow, ...]:
    """Every card, bundle, figure key and measured figure of ``runs``, sorted."""
    groups: dict[tuple[str, FigureKey, str], list[Sample]] = {}
    cards = {config.name: config for config in configs}
    for run in runs:
        card = card_of(run, configs)
        if card is None:
            continue
        for (key, metric), (value, predicted) in figure_medians(run).items():
            if metric in ("decode_tps", "ttft_ms"):
                groups.setdefault((card.name, key, metric), []).append(
                    Sample(run.run_id, run.started_at, run.harness_version, value, predicted))
    rows: list[CalibrationRow] = []
    for (name, key, metric), samples in groups.items():
        ordered = tuple(sorted(samples, key=lambda s: s.started_at))
        values = [s.value for s in ordered]
        metrics = cards[name].expected_metrics
        if metric == "decode_tps":
            median = statistics.median(values)
            rows.append(CalibrationRow(name, key.fixture, key, "decode_tps", median,
                                       _relative_iqr(values, median), ordered,
                                       metrics.tokens_per_second_decode))
            efficiency = _efficiency(ordered, key)
            if efficiency is not None:
                rows.append(CalibrationRow(name, key.fixture, key, "decode_efficiency",
                                           efficiency, None, ordered, None))
        else:
            # The configs' ttfa figures are a speech bundle's time to first audio, not
            # a time to first token: nothing extrapolated sits beside these.
            for figure, share in (("ttft_p50_ms", 0.50), ("ttft_p95_ms", 0.95)):
                rows.append(CalibrationRow(name, key.fixture, key, figure,
                                           _percentile(values, share), None, ordered, None))
    return tuple(sorted(rows, key=lambda r: (r.card, r.bundle, key_label(r.key), r.metric)))


def measured_section(rows: Iterable[CalibrationRow], min_runs: int) -> dict[str, Any]:
    """One card's ``measured`` object: bundle → figure key → figures and provenance."""
    section: dict[str, dict[str, dict[str, Any]]] = {}
    for row in rows:
        if row.runs < min_runs:
            continue
        entry = section.setdefault(row.bundle, {}).setdefault(key_label(row.key), {
            "_provenance": PROVENANCE, "runs": row.runs,
            "run_ids": [s.run_id for s in row.samples],
            "first": row.samples[0].started_at, "last": row.samples[-1].started_at,
            "harness_versions": sorted({s.harness_version for s in row.samples})})
        # The median over the nights and its spread; a percentile or an efficiency is
        # one number already.
        entry[row.metric] = ({"median": round(row.measured, 6),
                              "spread": round(row.spread, 6)} if row.spread is not None
                             else round(row.measured, 6))
    # Stable order, so a rewrite with the same runs changes no byte.
    return {bundle: {key: dict(sorted(entry.items())) for key, entry in sorted(keys.items())}
            for bundle, keys in sorted(section.items())}


def with_measured(config: Mapping[str, Any], section: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (a card's JSON object) with its ``measured`` section replaced.

    The extrapolated ``expected_metrics`` stay: they describe no bundle (the configs name
    none), so no measurement can be said to be of what they describe.
    """
    updated = {k: v for k, v in config.items() if k != "measured"}
    if section:
        updated["measured"] = dict(section)
    return updated


def _relative_iqr(values: Sequence[float], median: float) -> float:
    if len(values) < 2 or median == 0:
        return 0.0
    quartiles = statistics.quantiles(values, n=4, method="inclusive")
    return (quartiles[2] - quartiles[0]) / median


def _percentile(values: Sequence[float], share: float) -> float:
    """The ``share`` percentile by linear interpolation between the closest ranks."""
    ordered = sorted(values)
    position = share * (len(ordered) - 1)
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _efficiency(samples: Sequence[Sample], key: FigureKey) -> float | None:
    ratios = [s.value / s.predicted for s in samples if s.predicted]
    if not ratios:
        return None
    assumed = HOST_EFFICIENCY if key.backend == "cpu" else GPU_EFFICIENCY
    return assumed * statistics.median(ratios)
