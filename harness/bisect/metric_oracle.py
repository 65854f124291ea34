"""``--metric``: each probed build measured against the endpoints with the A/B machinery.

The good endpoint is the reference and is not measured. The bad endpoint must measure
regressed against it, or the regression does not reproduce. A probe is measured in
rounds, against the good build and then the bad one: regressed beside good means bad,
unchanged or improved beside good means good, improved beside bad means good,
unchanged beside bad means bad. "Regressed beside good" is checked against the bad
side before it moves the search: a first look of a few pairs can be a false alarm
(a build identical to the good one read 0.900 [0.852, 0.957] after 6 pairs here), and
one wrong probe names a wrong commit. Read improved beside bad as well, the two
disagree and the next round measures both further; in the last round, regressed beside
good decides (a probe between the ends has regressed past the threshold). Each side is
quick to show where the probe differs from it (a regression the size of the endpoints'
shows in a few pairs) and slow where it matches (showing "unchanged" needs a narrow
interval), so the rounds start short
(``FIRST_ROUND_S`` a comparison) and double until the probe's budget is spent. Each
round continues the comparisons of the round before (their pairs count, so the
intervals narrow), rather than starting them again. A probe that matches neither side
by then is undecided — a candidate, never a guess.

The comparisons use the design ``harness ab`` would pick on this runner (``auto``: one
its calibration validated, else the sequential design, the ground truth): a design that
shares the hardware between the arms would misjudge exactly the probes near the
threshold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path

from harness import modelgen
from harness.ab.decision import AbRule, MetricDecision
from harness.ab.design_check import load_validation
from harness.ab.runner import AbOutcome, AbSettings, Arm, run_ab
from harness.ab.validation import auto_design, record_for, validated_metrics
from harness.bisect.history import Commit
from harness.bisect.oracles import Judgement, ProbeContext
from harness.bisect.search import Verdict
from harness.builds.native import BuildResult
from harness.facts.build import Backend
from harness.paths import cache_root
from harness.results.rules import AbVerdict

#: Seconds of the first comparison against each side; each later round doubles it.
FIRST_ROUND_S = 30.0
#: The most a round spends checking "regressed beside good" against the bad side: a
#: probe as fast as the good one shows improved beside bad in a first look (6 pairs,
#: about 12 s here), and one as slow as the bad one is let through at this bound.
CONFIRM_S = 15.0
#: ``--design``'s default: what ``harness ab --design auto`` picks on this runner.
AUTO = "auto"


def metric_settings(metric: str, *, fixture: str, rule: AbRule, design: str,
                    backend: Backend) -> AbSettings:
    """The A/B settings of a metric oracle: one metric, the fixture's model, the design
    this runner's calibration allows for builds of ``backend``."""
    record = record_for(load_validation(cache_root()), [backend, backend])
    if design == AUTO:
        design = auto_design((metric,), record, host_processes=True)
    return AbSettings(model=modelgen.ensure_fixtures().model(fixture), fixture=fixture,
                      metrics=(metric,), rule=rule, design=design,
                      validated=validated_metrics(design, (metric,), record))


def _arm(label: str, build: BuildResult) -> Arm:
    return Arm(label=label, binary=build.binary, backend=build.info.backend)


def describe_decision(against: str, decision: MetricDecision) -> str:
    """``decode_tps 0.912 [0.897, 0.926] vs good: regressed (12 pairs)`` (pure)."""
    interval = decision.interval
    figures = (f"{interval.ratio:.3f} [{interval.low:.3f}, {interval.high:.3f}]"
               if interval is not None else "no ratio")
    why = f" ({decision.reason})" if decision.reason else ""
    return (f"{decision.metric} {figures} vs {against}: {decision.verdict.value}{why}, "
            f"{decision.pairs} pairs")


def _ratio(decision: MetricDecision) -> tuple[float, float, float] | None:
    interval = decision.interval
    return None if interval is None else (interval.ratio, interval.low, interval.high)


def verdict_of(against_good: MetricDecision, against_bad: MetricDecision | None, *,
               final: bool = True) -> Verdict:
    """A middle probe's verdict from its comparisons (pure): see the module's doc.
    ``final``: the last round, where a disagreement is settled by the good side."""
    if against_good.verdict is AbVerdict.REGRESSED:
        disagree = against_bad is not None and against_bad.verdict is AbVerdict.IMPROVED
        return Verdict.UNDECIDED if disagree and not final else Verdict.BAD
    if against_good.verdict in (AbVerdict.UNCHANGED, AbVerdict.IMPROVED):
        return Verdict.GOOD
    if against_bad is None:
        return Verdict.UNDECIDED
    if against_bad.verdict is AbVerdict.IMPROVED:
        return Verdict.GOOD
    if against_bad.verdict is AbVerdict.UNCHANGED:
        return Verdict.BAD
    return Verdict.UNDECIDED


@dataclass(frozen=True)
class MetricOracle:
    #: One metric (``settings.metrics`` holds it alone), the fixture, rule and design.
    settings: AbSettings

    @property
    def metric(self) -> str:
        return self.settings.metrics[0]

    def describe(self) -> str:
        rule = self.settings.rule
        return (f"metric: {self.metric} on {self.settings.fixture}, threshold "
                f"{rule.threshold:g}, {self.settings.design} design, budget {rule.budget_s:g} s")

    def judge(self, build: BuildResult, commit: Commit, context: ProbeContext) -> Judgement:
        started = time.monotonic()
        if commit == context.good:
            return Judgement(Verdict.GOOD, "the reference the other builds are measured "
                             "against", time.monotonic() - started)
        good = context.build_of(context.good)
        budget = self.settings.rule.budget_s
        if commit == context.bad:
            endpoint = self._compare(good, build, context.folder / "vs-good", budget)
            verdict = (Verdict.BAD if endpoint.verdict is AbVerdict.REGRESSED
                       else Verdict.GOOD if endpoint.verdict is not AbVerdict.UNKNOWN
                       else Verdict.UNDECIDED)
            return Judgement(verdict, describe_decision("good", endpoint),
                             time.monotonic() - started, _ratio(endpoint))
        bad = context.build_of(context.bad)
        said: list[str] = []
        verdict = Verdict.UNDECIDED
        against_good: MetricDecision | None = None
        # Each side's comparison so far, continued by the next round.
        sides: dict[str, AbOutcome | None] = {"good": None, "bad": None}
        left, round_s, round_number = budget, min(FIRST_ROUND_S, budget / 2), 1
        while left > 0:
            folder = context.folder / f"round-{round_number}"
            final = left - 2 * round_s <= 0
            against_good = self._continue(sides, "good", good, build, folder=folder,
                                          round_s=round_s)
            said = [describe_decision("good", against_good)]
            verdict = verdict_of(against_good, None, final=final)
            if verdict is not Verdict.GOOD:  # undecided, or bad until the bad side agrees
                confirm = against_good.verdict is AbVerdict.REGRESSED
                against_bad = self._continue(
                    sides, "bad", bad, build, folder=folder,
                    round_s=min(round_s, CONFIRM_S) if confirm else round_s)
                said.append(describe_decision("bad", against_bad))
                verdict = verdict_of(against_good, against_bad, final=final)
            if verdict is not Verdict.UNDECIDED:
                break
            left -= 2 * round_s
            round_s, round_number = min(2 * round_s, left / 2), round_number + 1
        rounds = f" (round {round_number})" if round_number > 1 else ""
        return Judgement(verdict, "; ".join(said) + rounds, time.monotonic() - started,
                         None if against_good is None else _ratio(against_good))

    def _continue(self, sides: dict[str, AbOutcome | None], side: str,
                  endpoint: BuildResult, probe: BuildResult, *, folder: Path,
                  round_s: float) -> MetricDecision:
        """The probe against one endpoint, ``round_s`` more seconds of it."""
        before = sides[side]
        spent = before.elapsed_s if before is not None else 0.0
        outcome = self._run(endpoint, probe, folder / f"vs-{side}", spent + round_s, before)
        sides[side] = outcome
        return self._decision(outcome)

    def _compare(self, baseline: BuildResult, probe: BuildResult, logs: Path,
                 budget_s: float) -> MetricDecision:
        return self._decision(self._run(baseline, probe, logs, budget_s, None))

    def _run(self, baseline: BuildResult, probe: BuildResult, logs: Path, budget_s: float,
             resume: AbOutcome | None) -> AbOutcome:
        logs.mkdir(parents=True, exist_ok=True)
        settings = replace(self.settings, rule=replace(self.settings.rule, budget_s=budget_s))
        return run_ab(_arm("baseline", baseline), _arm("candidate", probe), settings,
                      log_dir=logs, resume=resume)

    def _decision(self, outcome: AbOutcome) -> MetricDecision:
        return next(d for d in outcome.decisions if d.metric == self.metric)
