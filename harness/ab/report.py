"""What an A/B comparison says: the table, the JSON, the run record's ``ab`` object (pure)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from harness.ab.counters import CounterReport, compare_counters, counters_json, counters_markdown
from harness.ab.covariate import NO_COVARIATE
from harness.ab.decision import MetricDecision
from harness.ab.design import BASELINE, CANDIDATE, Sample
from harness.ab.runner import AbOutcome
from harness.ab.undecided import (
    seconds_per_pair,
    undecided_lines,
    undecided_metrics,
    would_decide,
)
from harness.results.rules import AbVerdict
from harness.results.run_record import METRICS


def samples_of(outcome: AbOutcome, arm: str) -> Sequence[Sample]:
    return [sample for sample in outcome.samples if sample.arm == arm]


def counter_report(outcome: AbOutcome) -> CounterReport:
    return compare_counters([s.counters for s in samples_of(outcome, BASELINE)],
                            [s.counters for s in samples_of(outcome, CANDIDATE)])


def _num(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"


def _ratio_cells(decision: MetricDecision) -> tuple[str, str]:
    interval = decision.interval
    if interval is None:
        return "-", "-"
    return f"{interval.ratio:.3f}", f"[{interval.low:.3f}, {interval.high:.3f}]"


def undecided(outcome: AbOutcome) -> list[str]:
    """The metrics that leave the comparison undecided (``harness ab`` exits 3)."""
    return undecided_metrics(outcome.decisions, failed=outcome.failed)


def _would_decide(outcome: AbOutcome, decision: MetricDecision) -> str | None:
    """What would decide ``decision``: a sentence for an ``unknown``, None otherwise."""
    if decision.verdict is not AbVerdict.UNKNOWN:
        return None
    return would_decide(decision, seconds_per_pair(outcome.elapsed_s, decision.pairs),
                        outcome.settings.rule.min_pairs)


def table(outcome: AbOutcome) -> str:
    """The plain-text table ``harness ab`` prints, with the counters below it and, last,
    an ``undecided:`` line per metric that leaves the comparison undecided (the gate
    copies those lines into its summary)."""
    rows = [("metric", "baseline median", "candidate median", "ratio", "95% CI", "band",
             "pairs", "verdict", "decided after")]
    for decision in outcome.decisions:
        unit = METRICS[decision.metric].unit
        ratio, interval = _ratio_cells(decision)
        after = outcome.decided_after_s.get(decision.metric)
        rows.append((f"{decision.metric} ({unit})", _num(decision.baseline_median),
                     _num(decision.candidate_median), ratio, interval,
                     f"±{decision.threshold:.1%}", str(decision.pairs),
                     decision.verdict, f"{after:.0f} s" if after is not None else "-"))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
             .rstrip() for row in rows]
    settings = outcome.settings
    head = (f"A/B: candidate {outcome.candidate.describe()} against baseline "
            f"{outcome.baseline.describe()}\n"
            f"fixture {settings.fixture}, {settings.design} design, "
            f"{len(outcome.samples)} server starts in {outcome.blocks} blocks, "
            f"{outcome.elapsed_s:.0f} s; threshold {settings.rule.threshold:.1%}, budget "
            f"{settings.rule.budget_s:.0f} s{_extension(outcome)}, seed {outcome.seed}\n"
            f"prompt {settings.n_prompt} tokens, first token timed on "
            f"{settings.first_prompt()}; {_sampling(outcome)}")
    reasons = [f"{d.metric} unknown: {d.reason}" for d in outcome.decisions if d.reason]
    numerics = outcome.numerics
    pending = undecided_lines(outcome.decisions, failed=outcome.failed,
                              elapsed_s=outcome.elapsed_s,
                              min_pairs=settings.rule.min_pairs)
    return "\n".join([head, "", *lines, *(["", *reasons] if reasons else []), "",
                      f"numerics: {numerics.verdict} — {numerics.reason}", "",
                      counters_markdown(counter_report(outcome)),
                      *(["", *pending] if pending else [])])


def _sampling(outcome: AbOutcome) -> str:
    """The head's word on what each start measured and how the pairs were read."""
    settings = outcome.settings
    words = [f"decode {settings.gen_tokens()} tokens x {settings.repetitions} completions "
             f"after {settings.warmup or 0} warm-up"]
    if settings.pin_client:
        words.append("client pinned off the server's cores")
    if settings.covariate != NO_COVARIATE:
        cuts = [f"{d.metric} {1 - d.variance_share:.0%}" for d in outcome.decisions
                if d.variance_share is not None and d.variance_share < 1]
        words.append(f"covariate {settings.covariate}"
                     + (f" (variance cut: {', '.join(cuts)})" if cuts else ""))
    return "; ".join(words)


def _extension(outcome: AbOutcome) -> str:
    """The head's word on measuring past the budget: how far it may, and how far it did."""
    rule = outcome.settings.rule
    if not rule.extend_s:
        return ""
    if not outcome.extended_for:
        return f" (+{rule.extend_s:.0f} s for a shown change; not needed)"
    return (f" (+{rule.extend_s:.0f} s for a shown change; used {outcome.extended_s:.0f} s "
            f"for {', '.join(outcome.extended_for)})")


def _decision_json(decision: MetricDecision, decided_after: float | None,
                   would: str | None) -> dict[str, Any]:
    interval = decision.interval
    return {
        "metric": decision.metric, "unit": METRICS[decision.metric].unit,
        "verdict": decision.verdict.value, "pairs": decision.pairs,
        # The band's t: the rule's threshold, or wider for a metric's absolute floor.
        "threshold": decision.threshold,
        "baseline_median": decision.baseline_median,
        "candidate_median": decision.candidate_median,
        "ratio": interval.ratio if interval else None,
        "ci_low": interval.low if interval else None,
        "ci_high": interval.high if interval else None,
        "confidence": interval.confidence if interval else None,
        "decided_after_s": decided_after,
        "reason": decision.reason,
        # What would decide an unknown (harness/ab/undecided.py); None once decided.
        "would_decide": would,
        # With a covariate: the adjusted log ratios' variance over the raw ones'.
        "variance_share": decision.variance_share,
    }


def outcome_json(outcome: AbOutcome) -> dict[str, Any]:
    """Everything: settings, decisions, counters, and every sample in its order."""
    settings = outcome.settings
    return {
        "baseline": outcome.baseline.describe(), "candidate": outcome.candidate.describe(),
        "fixture": settings.fixture, "design": settings.design, "seed": outcome.seed,
        "threshold": settings.rule.threshold, "budget_s": settings.rule.budget_s,
        "extend_s": settings.rule.extend_s, "extended_s": outcome.extended_s,
        "extended_for": list(outcome.extended_for),
        "confidence": settings.rule.confidence, "elapsed_s": outcome.elapsed_s,
        "blocks": outcome.blocks, "regressed": outcome.regressed,
        "undecided": undecided(outcome),
        "numerics": outcome.numerics.as_json(),
        "n_prompt": settings.n_prompt, "ttft_prompt": settings.first_prompt(),
        "n_gen": settings.gen_tokens(), "repetitions": settings.repetitions,
        "warmup": settings.warmup or 0, "pin_client": settings.pin_client,
        "covariate": settings.covariate,
        "metrics": [_decision_json(d, outcome.decided_after_s.get(d.metric),
                                   _would_decide(outcome, d))
                    for d in outcome.decisions],
        "counters": counters_json(counter_report(outcome)),
        "samples": [{"sequence": s.sequence, "arm": s.arm, "pair": s.pair, "block": s.block,
                     "at_s": s.at_s, "half": s.half, "values": s.values,
                     "machine": s.machine,
                     "counters": s.counters,
                     "fingerprint": s.fingerprint.as_json() if s.fingerprint else None}
                    for s in outcome.samples],
    }


def _record_metric(decision: MetricDecision, would: str | None) -> dict[str, Any]:
    interval = decision.interval
    body: dict[str, Any] = {"verdict": decision.verdict.value, "pairs": decision.pairs,
                            "ratio": interval.ratio if interval else None,
                            "ci_low": interval.low if interval else None,
                            "ci_high": interval.high if interval else None}
    if decision.reason is not None:
        body["reason"] = decision.reason[:1024]
    if would is not None:
        body["would_decide"] = would[:1024]
    return body


def record_json(outcome: AbOutcome) -> dict[str, Any]:
    """The run record's ``ab`` object: per metric ratio, CI bounds, verdict, pairs (and
    for an unknown what would decide it), and the metrics that leave it undecided."""
    report = counter_report(outcome)
    return {
        "baseline": outcome.baseline.describe()[:1024],
        "candidate": outcome.candidate.describe()[:1024],
        "design": outcome.settings.design, "threshold": outcome.settings.rule.threshold,
        # The verdict's plain text: the run record's ``ab`` is plain JSON.
        "metrics": {d.metric: _record_metric(d, _would_decide(outcome, d))
                    for d in outcome.decisions},
        # Empty when decided: ``harness ab`` exited 0 or 1, not 3.
        "undecided": undecided(outcome),
        "counter_changes": [{"name": c.name, "baseline": c.baseline[:4096],
                             "candidate": c.candidate[:4096]} for c in report.changed],
        "numerics": outcome.numerics.as_json(),
    }
