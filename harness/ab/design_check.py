"""``harness ab --calibrate-design``: show on this runner which designs see a real change.

Known slowdowns are injected — the slowed build of the pinned source
(harness/builds/slowed.py) against the pinned build — one kind per metric that has one:
a decode wait for ``decode_tps``, a prompt wait for ``prompt_tps``, a delay before the
first token for ``ttft_ms``, each sized from the baseline's own figure to make that
metric ``--slowdown`` worse. Every design measures each; the sequential design (each arm
alone) is the ground truth, and a design whose measured effect lies within
``EFFECT_TOLERANCE`` of it is validated for that metric on this host. The record goes to
``$HARNESS_CACHE/ab-validation/<host>.json`` (or ``$HARNESS_AB_VALIDATION``) with its
date, and ``--design auto`` and the "unchanged must be earned" rule read it from there
(harness/ab/validation.py). ``load_s`` has no injected kind, so no design but the
sequential one may call it unchanged.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import socket
import statistics
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from harness.ab.decision import AbRule
from harness.ab.design import DESIGNS, SEQUENTIAL, paired_values
from harness.ab.runner import AbOutcome, AbSettings, Arm, run_ab
from harness.ab.validation import DesignCheck, ValidationRecord, effect, record_from_json
from harness.builds.resolve import ensure_build
from harness.builds.slowed import (
    SLOWDOWN_BY_NAME,
    ensure_slowed_build,
    slowdown_env,
    wait_for_slowdown,
)
from harness.errors import ConfigError
from harness.files import write_json_atomic
from harness.planning.build_plan import BuildRequest
from harness.results.run_record import METRICS, Direction

#: The injected change: this much worse, as the sequential design measures it.
DEFAULT_SLOWDOWN = 0.10
#: The kind of slowdown that validates each metric (harness/builds/slowed.py SLOWDOWNS).
CALIBRATING_KINDS = {"decode_tps": "decode-wait", "prompt_tps": "prompt",
                     "ttft_ms": "first-token"}


def amount_for(kind: str, fraction: float, baseline: float) -> int:
    """The amount of ``kind`` that makes its metric ``fraction`` worse at ``baseline``
    (tokens/s for the waits per token, milliseconds for the first-token delay)."""
    if not 0.0 < fraction < 1.0 or baseline <= 0:
        raise ConfigError(f"cannot size a {fraction!r} {kind} slowdown from {baseline!r}")
    if kind == "first-token":
        return round(baseline * 1000.0 * fraction / (1.0 - fraction))
    return wait_for_slowdown(fraction, baseline)  # µs a token, decode or prompt alike


#: Where the record is kept instead of the cache (a test's own file, a shared volume).
VALIDATION_ENV = "HARNESS_AB_VALIDATION"


def validation_path(cache: Path, host: str | None = None) -> Path:
    """``$HARNESS_AB_VALIDATION``, else ``<cache>/ab-validation/<host>.json``."""
    given = os.environ.get(VALIDATION_ENV)
    if given:
        return Path(given)
    return cache / "ab-validation" / f"{host or socket.gethostname()}.json"


def load_validation(cache: Path, host: str | None = None) -> ValidationRecord | None:
    """This host's record, or None when there is none; a damaged one is an error."""
    path = validation_path(cache, host)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    try:
        return record_from_json(json.loads(text))
    except ValueError as exc:  # json.JSONDecodeError is one
        raise ConfigError(f"{path}: {exc}; delete it and run `harness ab "
                          "--calibrate-design` again") from exc


def measured_effect(outcome: AbOutcome, metric: str) -> float:
    """The change a design measured: the median of its pairs' candidate/baseline ratios
    of ``metric``, from however many pairs it took (the stop rule's interval needs more),
    as a slowdown."""
    baseline, candidate = paired_values(outcome.samples, metric)
    if not baseline:
        raise ConfigError(f"the {outcome.settings.design} design measured no complete pair "
                          f"of {metric} within the budget; give --budget-s more seconds")
    ratio = statistics.median(c / b for b, c in zip(baseline, candidate, strict=True))
    return effect(ratio, METRICS[metric].direction is Direction.HIGHER_IS_BETTER)


@dataclass(frozen=True)
class Calibration:
    record: ValidationRecord
    #: Per metric, the amount of its kind of slowdown that was injected.
    amounts: dict[str, int]
    outcomes: tuple[AbOutcome, ...]
    path: Path


def calibrate_designs(cache: Path, model: Path, fixture: str, *, slowdown: float,
                      budget_s: float, metrics: tuple[str, ...] = tuple(CALIBRATING_KINDS),
                      seed: int | None = None,
                      on_design: Callable[[str, DesignCheck], None] | None = None,
                      log_dir: Path | None = None) -> Calibration:
    """Measure each metric's injected slowdown solo and with every design; write the
    record (replacing this host's earlier one)."""
    unknown = sorted(set(metrics) - set(CALIBRATING_KINDS))
    if unknown:
        raise ConfigError(f"no injected slowdown validates {', '.join(unknown)}; "
                          f"calibrate one of {', '.join(CALIBRATING_KINDS)}")
    pinned = Path(ensure_build(cache, BuildRequest()).info.binary)
    slowed = Path(ensure_slowed_build(cache).info.binary)
    baseline, candidate = Arm("baseline", binary=pinned), Arm("candidate", binary=slowed)
    base = AbSettings(model=model, fixture=fixture, metrics=metrics, design=SEQUENTIAL,
                      rule=AbRule(budget_s=budget_s), seed=seed)
    # Each kind is sized from the baseline's own figure under the sequential design's
    # cores and threads (one block of A/A starts), both arms' medians averaged: one arm's
    # few samples once read decode at under half its speed and sized a 30 % slowdown to
    # 51 % (a fresh-clone CI run).
    probe = run_ab(baseline, baseline, replace(base, rule=AbRule(budget_s=1.0)),
                   log_dir=log_dir)
    medians = {d.metric: statistics.fmean(m for m in (d.baseline_median, d.candidate_median)
                                          if m is not None)
               for d in probe.decisions if d.baseline_median is not None}
    outcomes: list[AbOutcome] = []
    checks: list[DesignCheck] = []
    amounts: dict[str, int] = {}
    for metric in metrics:
        figure = medians.get(metric)
        if figure is None:
            raise ConfigError(f"the pinned build reported no {metric} on {fixture}; check "
                              "that it serves the fixture (harness run -k smoke)")
        kind = SLOWDOWN_BY_NAME[CALIBRATING_KINDS[metric]]
        amounts[metric] = amount_for(kind.name, slowdown, figure)
        env = {"candidate": slowdown_env(kind, amounts[metric])}
        solo_effect: float | None = None
        for design in (SEQUENTIAL, *(d for d in DESIGNS if d != SEQUENTIAL)):
            outcome = run_ab(baseline, candidate,
                             replace(base, design=design, metrics=(metric,)), env=env,
                             log_dir=log_dir)
            outcomes.append(outcome)
            measured = measured_effect(outcome, metric)
            solo_effect = measured if solo_effect is None else solo_effect
            check = DesignCheck(design=design, metric=metric, solo_effect=solo_effect,
                                design_effect=measured, pairs=outcome.decisions[0].pairs)
            checks.append(check)
            if on_design is not None:
                on_design(design, check)
    record = ValidationRecord(host=socket.gethostname(),
                              date=dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                              builds=(str(pinned), str(slowed)), checks=tuple(checks))
    path = validation_path(cache)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record.to_json())
    return Calibration(record=record, amounts=amounts, outcomes=tuple(outcomes), path=path)
