"""Measuring the ranked candidates against the current plan (the I/O of a tune).

Each candidate is one paired A/B comparison on the same binary: the current plan's
launch as the baseline arm, the candidate's as the other, fresh servers for every
sample. The design is ``interleaved``: each start runs alone with every core, so no
arm shares the hardware with the one it is judged against — the duet design would
halve the cores under a threads or batch candidate (exactly what a tune changes), and
the sequential design pins each start to half of them. Candidates are measured in rank
order; each gets an equal share of what is left of the budget, and those the budget
does not reach are listed as not measured.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from harness.ab.decision import AbRule
from harness.ab.design import INTERLEAVED
from harness.ab.design_check import load_validation
from harness.ab.runner import AbOutcome, AbSettings, Arm, run_ab
from harness.ab.validation import record_for, validated_metrics
from harness.errors import HarnessError
from harness.facts.build import Backend
from harness.paths import cache_root
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS
from harness.tune.candidates import Candidate
from harness.tune.winner import Measured

#: The figures a tune compares: what a user of the server feels.
TUNE_METRICS = ("decode_tps", "prompt_tps", "ttft_ms")
#: A comparison shorter than this decides nothing (a few pairs of fresh starts).
MIN_COMPARISON_S = 20.0


@dataclass(frozen=True)
class TuneRun:
    binary: Path
    backend: Backend
    fixture: str
    budget_s: float
    top: int
    rule: AbRule
    metrics: tuple[str, ...] = TUNE_METRICS
    n_prompt: int = DEFAULT_PROMPT_TOKENS
    n_gen: int = DEFAULT_GEN_TOKENS
    repetitions: int = DEFAULT_REPETITIONS
    seed: int | None = None
    #: A container build: its image, started in place of ``binary`` (not on the host).
    image: str | None = None


def measure_candidates(current: Candidate, ranked: Sequence[Candidate], run: TuneRun, *,
                       log_dir: Path, on_result: Callable[[Measured], None] | None = None
                       ) -> list[Measured]:
    """The comparisons of the first ``run.top`` candidates, in rank order, until the
    budget is spent."""
    chosen = [c for c in ranked if c.pruned is None][:run.top]
    started = time.monotonic()
    found: list[Measured] = []
    for index, candidate in enumerate(chosen):
        left = run.budget_s - (time.monotonic() - started)
        share = left / (len(chosen) - index)
        if share < MIN_COMPARISON_S:
            break
        measured = _compare(current, candidate, run, share, log_dir / f"{index + 1:02d}")
        found.append(measured)
        if on_result is not None:
            on_result(measured)
    return found


def _compare(current: Candidate, candidate: Candidate, run: TuneRun, budget_s: float,
             log_dir: Path) -> Measured:
    record = record_for(load_validation(cache_root()), [run.backend, run.backend])
    settings = AbSettings(
        model=current.plan.spec.model, fixture=run.fixture, metrics=run.metrics,
        rule=replace(run.rule, budget_s=budget_s), design=INTERLEAVED,
        n_prompt=run.n_prompt, ttft_prompt=run.n_prompt, n_gen=run.n_gen,
        repetitions=run.repetitions, seed=run.seed,
        validated=validated_metrics(INTERLEAVED, run.metrics, record))
    baseline = _arm("current", current, run)
    other = _arm("candidate", candidate, run)
    started = time.monotonic()
    try:
        outcome = run_ab(baseline, other, settings, log_dir=log_dir)
    except HarnessError as exc:
        return Measured(candidate, error=str(exc), elapsed_s=time.monotonic() - started)
    return Measured(candidate, decisions=outcome.decisions, elapsed_s=outcome.elapsed_s,
                    samples=_samples(outcome))


def _arm(label: str, candidate: Candidate, run: TuneRun) -> Arm:
    spec = candidate.plan.spec
    if candidate.threads is not None:
        spec = replace(spec, threads=candidate.threads)
    if run.image is not None:
        return Arm(label=label, image=run.image, backend=run.backend, spec=spec)
    return Arm(label=label, binary=run.binary, backend=run.backend, spec=spec)


def _samples(outcome: AbOutcome) -> tuple[dict[str, object], ...]:
    return tuple({"arm": s.arm, "pair": s.pair, "sequence": s.sequence,
                  "at_s": round(s.at_s, 3), "values": dict(s.values)}
                 for s in outcome.samples)
