"""A comparison written out: its JSON form and its GitHub-flavoured markdown summary.

Pure formatting of a :class:`harness.results.comparison.Comparison` (the CLI and the
results service print what these return); nothing here judges a figure.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from harness.facts.commit_ids import short_commit
from harness.numerics.fingerprint import NumericsVerdict
from harness.results.comparison import Comparison, FigureResult, TestChange
from harness.results.numerics_comparison import ProbeNumerics
from harness.results.rules import AbVerdict, FigureStatus
from harness.results.run_record import Outcome, metric_unit

_TEST_CATEGORIES = (
    ("newly_failing", "Newly failing tests"),
    ("fixed", "Fixed tests"),
    ("still_failing", "Still failing tests"),
    ("new_tests", "New tests"),
    ("removed_tests", "Removed tests"),
)

#: Longest failure message a markdown table cell shows.
_MESSAGE_CHARS = 160
#: Longest counter value shown (a greedy completion's text can run to pages).
_COUNTER_CHARS = 80
#: What would decide an undecided A/B metric: the run schema's cap, shown whole.
_WOULD_DECIDE_CHARS = 1024


# -- JSON ------------------------------------------------------------------------

def _finite_or_text(value: float | None) -> float | str | None:
    if value is None or math.isfinite(value):
        return value
    return "inf" if value > 0 else "-inf"


def _change_json(change: TestChange) -> dict[str, Any]:
    return {"test_id": change.test_id, "before": _value(change.before),
            "after": _value(change.after), "message": change.message}


def _value(outcome: Outcome | None) -> str | None:
    return None if outcome is None else outcome.value


def _figure_json(result: FigureResult) -> dict[str, Any]:
    j = result.judgement
    return {
        "key": asdict(result.key), "label": result.label, "metric": result.metric,
        "unit": result.unit, "status": result.status.value, "baseline_runs": j.n,
        "baseline_mean": j.mean, "baseline_stdev": j.stdev, "current": result.current,
        "change": _finite_or_text(j.change),
        "change_percent": _finite_or_text(None if j.change is None else j.change * 100),
        "z": _finite_or_text(j.z),
    }


def comparison_json(c: Comparison) -> dict[str, Any]:
    """JSON-ready form; non-finite numbers (a z over a flat baseline) as "inf"."""
    return {
        "regressed": c.regressed,
        # "undecided": nothing regressed, but the run's A/B left metrics undecided.
        "verdict": "regressed" if c.regressed else "undecided" if c.ab_undecided else "ok",
        "current_run": c.current_run_id,
        "baseline_runs": list(c.baseline_run_ids),
        "hardware": {**asdict(c.hardware), "identity": c.hardware.identity,
                     "description": c.hardware.describe()},
        "rule": asdict(c.rule),
        "tests": {name: [_change_json(t) for t in getattr(c, name)]
                  for name, _ in _TEST_CATEGORIES},
        "figures": [_figure_json(r) for r in c.figure_results],
        # Every status, zeros too, in FigureStatus's order.
        "figure_counts": {s.value: len(c.figures_with(s)) for s in FigureStatus},
        # As the run record holds it (every number finite, the schema saw to that).
        "ab": c.ab,
        "ab_undecided": c.ab_undecided,
        "bisect": c.bisect,
        "tune": c.tune,
        "numerics": [{"test_id": p.test_id, **p.comparison.as_json()} for p in c.numerics],
        "numerics_counts": {v.value: sum(p.comparison.verdict is v for p in c.numerics)
                            for v in NumericsVerdict},
        "drift": [{"card": d.card, "key": asdict(d.key), "label": d.key.label(),
                   "measured": asdict(d.measured), "current": d.current,
                   "change": d.change} for d in c.drift],
    }


# -- markdown --------------------------------------------------------------------

def _cell(text: str | None, limit: int = _MESSAGE_CHARS) -> str:
    if text is None:
        return "—"
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[:limit - 1] + "…"
    return flat.replace("|", "\\|")


def _num(value: float | None) -> str:
    if value is None:
        return "—"
    if not math.isfinite(value):
        return "∞" if value > 0 else "-∞"
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 1:
        return f"{value:.2f}"
    return f"{value:.3g}"


def _percent(change: float | None) -> str:
    if change is None:
        return "—"
    if not math.isfinite(change):
        return _num(change)
    return f"{change * 100:+.1f} %"


def _headline(c: Comparison) -> str:
    if not c.regressed and c.ab_undecided:
        # Not a pass: the A/B could neither show a slowdown nor rule one out.
        return (f"## ⚠️ Undecided: the A/B left {', '.join(c.ab_undecided)} undecided "
                "(no regression found, none ruled out)")
    if not c.regressed:
        return "## ✅ No regression"
    parts = []
    if c.newly_failing:
        parts.append(f"{len(c.newly_failing)} newly failing test"
                     f"{'s' if len(c.newly_failing) != 1 else ''}")
    if c.regressions:
        parts.append(f"{len(c.regressions)} figure regression"
                     f"{'s' if len(c.regressions) != 1 else ''}")
    if c.ab_regressions:
        parts.append(f"A/B regression in {', '.join(c.ab_regressions)}")
    if c.ab_numerics_changed:
        parts.append("the A/B candidate's numbers changed")
    if c.numerics_changes:
        parts.append(f"numbers changed in {len(c.numerics_changes)} numerics probe"
                     f"{'s' if len(c.numerics_changes) != 1 else ''}")
    return f"## ❌ Regressed: {', '.join(parts)}"


def _test_table(changes: Sequence[TestChange]) -> list[str]:
    lines = ["| Test | Before | Now | Message |", "| --- | --- | --- | --- |"]
    lines += [f"| `{_cell(t.test_id)}` | {t.before or '—'} | {t.after or '—'} | "
              f"{_cell(t.message)} |" for t in changes]
    return lines


def _figure_table(results: Sequence[FigureResult]) -> list[str]:
    lines = ["| Figure | Metric | Baseline mean ± stdev (runs) | Now | Change | z |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in results:
        j = r.judgement
        unit = f" {r.unit}" if r.unit else ""
        lines.append(f"| {_cell(r.label)} | {r.metric} | {_num(j.mean)} ± {_num(j.stdev)}"
                     f"{unit} ({j.n}) | {_num(r.current)}{unit} | {_percent(j.change)} | "
                     f"{_num(j.z)} |")
    return lines


def _ratio(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def _bisect_section(bisect: dict[str, Any]) -> list[str]:
    """What ``harness bisect --record`` found for this run's regression."""
    first_bad = bisect["first_bad"]
    if not bisect["reproduced"]:
        found = "the endpoints did not reproduce the regression"
    elif first_bad is not None:
        found = f"first bad commit `{first_bad['sha']}` {first_bad['subject']}"
    else:
        found = (f"one of {len(bisect['candidates'])} commits: "
                 + ", ".join(f"`{short_commit(c['sha'])}`" for c in bisect["candidates"]))
    return ["", "### Bisect", "", f"{found} (between `{short_commit(bisect['good'])}` and "
            f"`{short_commit(bisect['bad'])}`, {len(bisect['probes'])} probes, "
            f"{bisect['oracle']})."]


def _tune_section(tune: dict[str, Any]) -> list[str]:
    """What ``harness tune --record`` (or ``--check``) found of the card's plan."""
    where = (f"card `{tune['card']}`, `{tune['key']}` at context {tune['context']}, "
             f"build `{tune['build_key']}`")
    if not tune["stale"]:
        return ["", "### Tune", "", f"The card's plan holds ({where}): {tune['summary']}"]
    winner = tune["winner"]
    lines = ["", "### Stale card", "",
             f"A warning, not a failure: `{winner['name']}` beat the card's plan ({where}).",
             "", f"- plan: {_cell(', '.join(tune['current']))}",
             f"- better: {_cell('; '.join(winner['differs']))}", "",
             "| figure | ratio | interval | verdict | pairs |", "| --- | --- | --- | --- | --- |"]
    lines += [f"| {f['metric']} | {_ratio(f['ratio'])} | {_ratio(f['low'])}-"
              f"{_ratio(f['high'])} | {f['verdict']} | {f['pairs']} |"
              for f in winner["figures"]]
    return lines


def _ab_section(c: Comparison, ab: dict[str, Any]) -> list[str]:
    """The "Performance A/B" section: per metric ratio and CI, then changed counters."""
    threshold: float = ab["threshold"]
    regressed, undecided = c.ab_regressions, c.ab_undecided
    title = "### Performance A/B" + (f": ❌ regressed ({', '.join(regressed)})"
                                     if regressed else
                                     f": ⚠️ undecided ({', '.join(undecided)})"
                                     if undecided else "")
    lines = [
        "", title, "",
        f"Candidate `{_cell(ab['candidate'])}` against baseline `{_cell(ab['baseline'])}`, "
        f"measured side by side ({ab['design']} design). Ratio is candidate / baseline; "
        f"regressed (or improved) when the whole 95 % interval is more than "
        f"{threshold * 100:g} % worse (or better), unchanged when it lies within "
        f"{threshold * 100:g} %, unknown when the budget ran out first (undecided "
        f"unless a change under the metric's floor settled it).", "",
        "| Metric | Ratio | 95 % CI | Pairs | Verdict |", "| --- | --- | --- | --- | --- |",
    ]
    for name, m in c.ab_metrics:
        unit = f" ({metric_unit(name)})" if metric_unit(name) else ""
        interval = ("—" if m["ci_low"] is None or m["ci_high"] is None
                    else f"[{_ratio(m['ci_low'])}, {_ratio(m['ci_high'])}]")
        verdict = (f"**{m['verdict']}**" if m["verdict"] == AbVerdict.REGRESSED
                   else "⚠️ **undecided**" if name in undecided else m["verdict"])
        lines.append(f"| {name}{unit} | {_ratio(m['ratio'])} | {interval} | {m['pairs']} | "
                     f"{verdict} |")
    if undecided:
        lines += ["", "What would decide it:", ""]
        lines += [f"- {name}: {_cell(c.ab_would_decide(name), _WOULD_DECIDE_CHARS)}"
                  for name in undecided]
    changes: list[dict[str, str]] = ab["counter_changes"]
    if not changes:
        lines += ["", "No deterministic counter changed."]
        return lines
    lines += ["", f"Deterministic counters that changed ({len(changes)}):", "",
              "| Counter | Baseline | Candidate |", "| --- | --- | --- |"]
    lines += [f"| `{_cell(ch['name'])}` | {_cell(ch['baseline'], _COUNTER_CHARS)} | "
              f"{_cell(ch['candidate'], _COUNTER_CHARS)} |" for ch in changes]
    return lines


def _numerics_section(probes: Sequence[ProbeNumerics]) -> list[str]:
    """Each numerics probe's verdict: the changed ones in a table, the rest counted."""
    changed = [p for p in probes if p.changed]
    counts = ", ".join(f"{sum(p.comparison.verdict is v for p in probes)} {v.value}"
                       for v in NumericsVerdict)
    title = "### Numerics" + (f": ❌ numbers changed in {len(changed)}" if changed else "")
    lines = ["", title, "",
             f"Each probe's greedy tokens and top log-probabilities against the baseline "
             f"build's: changed past ten times the band between its runs and at least "
             f"the KL floor. Probes: {counts}."]
    if changed:
        lines += ["", "| Probe | Largest KLD | Limit | Why |", "| --- | --- | --- | --- |"]
        for probe in changed:
            found = probe.comparison
            largest = found.change.max_kld if found.change else None
            lines.append(f"| `{_cell(probe.test_id)}` | {_num(largest)} | "
                         f"{_num(found.limit)} | {_cell(found.reason)} |")
    return lines


def comparison_markdown(c: Comparison) -> str:
    """A GitHub-flavoured summary, e.g. for ``$GITHUB_STEP_SUMMARY``."""
    anchor, *older = c.baseline_run_ids
    rule = c.rule
    lines = [
        _headline(c), "",
        f"Run `{c.current_run_id}` against baseline `{anchor}`"
        + (f" and {len(older)} earlier run{'s' if len(older) != 1 else ''} "
           f"({', '.join(f'`{r}`' for r in older)})" if older else "")
        + f", on {c.hardware.describe()}.", "",
        f"A figure counts as moved when it is more than {rule.threshold * 100:g} % and "
        f"more than {rule.z:g} standard deviations from the mean of at least "
        f"{rule.min_runs} baseline runs, and more than its metric's absolute floor "
        f"(timings and memory); tests compare with `{anchor}` alone.",
    ]
    for name, title in _TEST_CATEGORIES:
        changes: tuple[TestChange, ...] = getattr(c, name)
        if changes:
            lines += ["", f"### {title} ({len(changes)})", "", *_test_table(changes)]
    for status, title in ((FigureStatus.REGRESSED, "Figure regressions"),
                          (FigureStatus.IMPROVED, "Figure improvements")):
        found = c.figures_with(status)
        if found:
            lines += ["", f"### {title} ({len(found)})", "", *_figure_table(found)]
    counts = [f"{len(c.figures_with(FigureStatus.UNCHANGED))} unchanged",
              f"{len(c.figures_with(FigureStatus.NO_BASELINE))} without a baseline "
              f"(fewer than {rule.min_runs} baseline runs)"]
    missing = c.figures_with(FigureStatus.MISSING_NOW)
    if missing:
        counts.append(f"{len(missing)} in the baseline but missing now")
    lines += ["", f"Figures: {', '.join(counts)}."]
    if c.numerics:
        lines += _numerics_section(c.numerics)
    if c.ab is not None:
        lines += _ab_section(c, c.ab)
    if c.bisect is not None:
        lines += _bisect_section(c.bisect)
    if c.tune is not None:
        lines += _tune_section(c.tune)
    if c.drift:
        lines += ["", f"### Drift from the card's measured figures ({len(c.drift)})", "",
                  "Reported, not judged: the decode speed left the band `harness calibrate` "
                  "recorded for this card (median ± its spread, at least "
                  f"{rule.threshold * 100:g} %).", "",
                  "| card | figure | measured (nights) | now | change |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {_cell(d.card)} | {_cell(d.key.label())} | {_num(d.measured.median)} ± "
                  f"{d.measured.spread * 100:.1f} % ({d.measured.runs}, last "
                  f"{_cell(d.measured.last)}) | {_num(d.current)} | {_percent(d.change)} |"
                  for d in c.drift]
    return "\n".join(lines) + "\n"
