"""``harness ab --calibrate-design``: show on this runner which designs see a real change.

A known decode slowdown is injected — the slowed build of the pinned source
(harness/builds/slowed.py) against the pinned build, its busy wait sized from the
baseline's own decode speed — and measured by every design. The sequential design (each
arm alone) is the ground truth; a design whose measured effect lies within
``EFFECT_TOLERANCE`` of it is validated for ``decode_tps`` on this host. The record goes
to ``$HARNESS_CACHE/ab-validation/<host>.json`` (or ``$HARNESS_AB_VALIDATION``) with its
date, and ``--design auto`` and the "unchanged must be earned" rule read it from there
(harness/ab/validation.py).

Only decode speed has a known injected change today, so only ``decode_tps`` can be
validated; the other metrics' "unchanged" stays the sequential design's alone.
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
from harness.builds.slowed import ensure_slowed_build, slowed_env, wait_for_slowdown
from harness.errors import ConfigError
from harness.files import write_json_atomic
from harness.planning.build_plan import BuildRequest

#: The injected change: this much slower decode, as the sequential design measures it.
DEFAULT_SLOWDOWN = 0.10
METRIC = "decode_tps"


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


def measured_effect(outcome: AbOutcome) -> float:
    """The slowdown a design measured: the median of its pairs' candidate/baseline
    ratios, from however many pairs it took (the stop rule's interval needs more)."""
    baseline, candidate = paired_values(outcome.samples, METRIC)
    if not baseline:
        raise ConfigError(f"the {outcome.settings.design} design measured no complete pair "
                          f"of {METRIC} within the budget; give --budget-s more seconds")
    ratio = statistics.median(c / b for b, c in zip(baseline, candidate, strict=True))
    return effect(ratio, higher_is_better=True)


@dataclass(frozen=True)
class Calibration:
    record: ValidationRecord
    wait_us: int
    outcomes: tuple[AbOutcome, ...]
    path: Path


def calibrate_designs(cache: Path, model: Path, fixture: str, *, slowdown: float,
                      budget_s: float, seed: int | None = None,
                      on_design: Callable[[str, DesignCheck], None] | None = None,
                      log_dir: Path | None = None) -> Calibration:
    """Measure the injected slowdown solo and with every design; write the record."""
    pinned = Path(ensure_build(cache, BuildRequest()).info.binary)
    slowed = Path(ensure_slowed_build(cache).info.binary)
    baseline, candidate = Arm("baseline", binary=pinned), Arm("candidate", binary=slowed)
    base = AbSettings(model=model, fixture=fixture, metrics=(METRIC,), design=SEQUENTIAL,
                      rule=AbRule(budget_s=budget_s), seed=seed)
    # The wait that makes decode `slowdown` slower, from the baseline's own speed under
    # the sequential design's cores and threads (one block of A/A starts).
    probe = run_ab(baseline, baseline, replace(base, rule=AbRule(budget_s=1.0)),
                   log_dir=log_dir)
    speed = probe.decisions[0].baseline_median
    if speed is None:
        raise ConfigError(f"the pinned build reported no decode speed on {fixture}; "
                          "check that it serves the fixture (harness run -k smoke)")
    wait_us = wait_for_slowdown(slowdown, speed)
    env = {"candidate": slowed_env(wait_us)}
    outcomes: list[AbOutcome] = []
    checks: list[DesignCheck] = []
    solo_effect: float | None = None
    for design in (SEQUENTIAL, *(d for d in DESIGNS if d != SEQUENTIAL)):
        outcome = run_ab(baseline, candidate, replace(base, design=design),
                         env=env, log_dir=log_dir)
        outcomes.append(outcome)
        measured = measured_effect(outcome)
        if design == SEQUENTIAL:
            solo_effect = measured
        assert solo_effect is not None
        check = DesignCheck(design=design, metric=METRIC, solo_effect=solo_effect,
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
    return Calibration(record=record, wait_us=wait_us, outcomes=tuple(outcomes), path=path)
