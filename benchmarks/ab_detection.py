"""How good is ``harness ab`` on this machine? False alarms, detection, time to decide.

    .venv/bin/python benchmarks/ab_detection.py [--aa 60] [--slowdowns 0.10,0.05]
        [--ab 30] [--log ab-detection.jsonl] [--design duet] [--budget-s 180]

(a) A/A: the pinned CPU build as both arms, ``--aa`` decisions; a false alarm is a
    metric judged ``regressed``. Printed per metric with its Wilson 95 % interval, and
    for each metric also the rate estimated by resampling all recorded A/A pairs.
(b) A/B: the pinned build against the slowed build (harness/builds/slowed.py: a busy
    wait after each sampled token, its length from HARNESS_SLOW_DECODE_US) at each
    ``--slowdowns`` fraction, ``--ab`` decisions each; the wait is computed from the
    baseline's measured decode speed, and the true slowdown is measured from the
    decisions' own paired samples (median candidate/baseline decode ratio).

Every decision is appended to ``--log`` (JSONL) as soon as it is made, so a run that
is stopped resumes where it left off; the figures are printed from the whole log.
Targets: <= 1 % false alarms, >= 95 % detection of 10 %, >= 80 % of 5 %, median
decision <= 90 s per metric.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from harness import modelgen
from harness.ab.decision import AbRule, AbVerdict, resampled_false_alarm_rate
from harness.ab.design import DESIGNS, DUET
from harness.ab.design_check import measured_effect
from harness.ab.report import outcome_json
from harness.ab.runner import AB_METRICS, AbSettings, Arm, run_ab
from harness.ab.stats import wilson_interval
from harness.builds.resolve import ensure_build
from harness.builds.slowed import SLOW_DECODE_ENV, ensure_slowed_build, wait_for_slowdown
from harness.paths import cache_root
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS
from harness.perf.measure import measure_speed
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.results.run_record import METRICS
from harness.runners.subprocess_runner import SubprocessRunner

TARGET_FALSE_ALARMS = 0.01
TARGET_DETECTION = {0.10: 0.95, 0.05: 0.80}
TARGET_DECISION_S = 90.0


def _entries(log: Path) -> list[dict[str, Any]]:
    if not log.is_file():
        return []
    found = []
    for line in log.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill: that decision is made again
    return found


def _decide(baseline: Arm, candidate: Arm, settings: AbSettings,
            env: dict[str, dict[str, str]]) -> dict[str, Any]:
    outcome = run_ab(baseline, candidate, settings, env=env)
    body = outcome_json(outcome)
    return {"verdicts": {m["metric"]: m["verdict"] for m in body["metrics"]},
            "decided_after_s": {m["metric"]: m["decided_after_s"] for m in body["metrics"]},
            "elapsed_s": body["elapsed_s"], "seed": body["seed"],
            "pairs": {m["metric"]: m["pairs"] for m in body["metrics"]},
            "samples": [{"arm": s["arm"], "pair": s["pair"], "values": s["values"]}
                        for s in body["samples"]]}


def _pairs(entries: list[dict[str, Any]], metric: str) -> Iterator[tuple[float, float]]:
    for entry in entries:
        by_pair: dict[int, dict[str, float]] = {}
        for sample in entry["samples"]:
            if metric in sample["values"]:
                by_pair.setdefault(sample["pair"], {})[sample["arm"]] = (
                    sample["values"][metric])
        for arms in by_pair.values():
            if len(arms) == 2:
                yield arms["baseline"], arms["candidate"]


def _rate(hits: int, total: int) -> str:
    if total == 0:
        return "no decisions"
    low, high = wilson_interval(hits, total)
    return f"{hits}/{total} = {hits / total:.1%} (95 % CI {low:.1%} to {high:.1%})"


def _median_decision(entries: list[dict[str, Any]], metric: str) -> str:
    times = [e["decided_after_s"][metric] for e in entries
             if e["decided_after_s"].get(metric) is not None]
    undecided = len(entries) - len(times)
    if not times:
        return f"none decided ({undecided} unknown)"
    return f"{statistics.median(times):.0f} s median ({undecided} of {len(entries)} unknown)"


def _report(entries: list[dict[str, Any]], rule: AbRule, slowdowns: list[float]) -> None:
    aa = [e for e in entries if e["case"] == "aa"]
    print(f"\nA/A: {len(aa)} decisions (target false alarms <= {TARGET_FALSE_ALARMS:.0%})")
    for metric in AB_METRICS:
        hits = sum(e["verdicts"].get(metric) == AbVerdict.REGRESSED for e in aa)
        unknown = sum(e["verdicts"].get(metric) == AbVerdict.UNKNOWN for e in aa)
        print(f"  {metric:11} false alarms {_rate(hits, len(aa))}; unknown {unknown}; "
              f"decision {_median_decision(aa, metric)}")
    pairs = list(_pairs(aa, "decode_tps"))
    if len(pairs) > 2:
        spread = statistics.stdev(math.log(c / b) for b, c in pairs)
        seconds = sum(e["elapsed_s"] for e in aa) / len(pairs)
        # The interval's width at a fixed budget goes as spread * sqrt(seconds per pair):
        # the design with the smaller product decides sooner.
        print(f"  decode_tps pairs: log-ratio spread {spread:.2%}, {seconds:.1f} s per pair, "
              f"spread x sqrt(s per pair) {spread * math.sqrt(seconds):.4f} "
              f"(design {aa[0].get('design', '?')})")
    for metric in AB_METRICS:
        recorded = list(_pairs(aa, metric))
        if len(recorded) < rule.min_pairs:
            continue
        per_decision = int(statistics.median(e["pairs"][metric] for e in aa))
        per_decision = max(per_decision, rule.min_pairs)
        # Judged as the gate judges: after every block, with the metric's floor.
        rate = resampled_false_alarm_rate(
            recorded, rule, METRICS[metric].direction, trials=4000,
            pairs_per_decision=per_decision, seed=1, sequential=True,
            min_change=METRICS[metric].min_change)
        print(f"  {metric:11} false alarms by resampling {len(recorded)} recorded pairs "
              f"({per_decision} per decision, looks every {rule.pairs_per_block}, 4000 "
              f"draws): {rate:.2%}")
    for fraction in slowdowns:
        case = [e for e in entries if e["case"] == f"ab-{fraction:g}"]
        if not case:
            continue
        ratios = [c / b for b, c in _pairs(case, "decode_tps")]
        true = 1 - statistics.median(ratios) if ratios else float("nan")
        hits = sum(e["verdicts"].get("decode_tps") == AbVerdict.REGRESSED for e in case)
        target = TARGET_DETECTION.get(fraction)
        print(f"\nA/B at {fraction:.0%} target slowdown (wait {case[0]['wait_us']} us/token): "
              f"true decode slowdown {true:.1%} (median of {len(ratios)} pairs)")
        print(f"  decode_tps detection {_rate(hits, len(case))}"
              + (f" (target >= {target:.0%})" if target else ""))
        print(f"  decode_tps decision {_median_decision(case, 'decode_tps')} "
              f"(target <= {TARGET_DECISION_S:.0f} s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--aa", type=int, default=60)
    parser.add_argument("--ab", type=int, default=30)
    parser.add_argument("--slowdowns", default="0.10,0.05")
    parser.add_argument("--log", type=Path, default=Path("ab-detection.jsonl"))
    parser.add_argument("--design", choices=DESIGNS, default=DUET)
    parser.add_argument("--budget-s", type=float, default=AbRule().budget_s)
    parser.add_argument("--wait", action="append", default=[], metavar="FRACTION=US",
                        help="use this wait for that slowdown instead of calibrating one "
                             "(repeatable), e.g. 0.10=245")
    parser.add_argument("--report-only", action="store_true",
                        help="print the figures of the log without deciding more")
    args = parser.parse_args()
    slowdowns = [float(part) for part in args.slowdowns.split(",") if part]
    fixed_waits = {float(f): int(us) for f, us in (item.split("=") for item in args.wait)}
    rule = AbRule(budget_s=args.budget_s)
    entries = _entries(args.log)
    if not args.report_only:
        cache = cache_root()
        pinned = Arm("baseline", binary=ensure_build(cache, BuildRequest()).binary)
        slowed = Arm("candidate", binary=ensure_slowed_build(cache).binary)
        model = modelgen.ensure_fixtures().model("bench")
        # The design's own verdicts, as measured: every metric counts as validated here,
        # since this benchmark is what shows (or not) that a design sees a change.
        settings = AbSettings(model=model, fixture="bench", rule=rule, design=args.design,
                              validated=frozenset(AB_METRICS))
        decode_only = AbSettings(model=model, fixture="bench", rule=rule,
                                 design=args.design, metrics=("decode_tps",),
                                 validated=frozenset(AB_METRICS))
        plain = dict(os.environ)
        plain.pop(SLOW_DECODE_ENV, None)
        cases: list[tuple[str, Arm, AbSettings, dict[str, str], int, int]] = [
            ("aa", Arm("candidate", binary=pinned.binary), settings, plain, 0, args.aa)]
        for fraction in slowdowns:
            wait = fixed_waits.get(fraction) or _wait_for(
                entries, fraction, pinned=pinned, slowed=slowed, settings=decode_only,
                plain=plain)
            cases.append((f"ab-{fraction:g}", slowed, decode_only,
                          {**plain, SLOW_DECODE_ENV: str(wait)}, wait, args.ab))
        # Round robin over the cases, so a run stopped early has figures for each.
        with args.log.open("a") as log:
            while True:
                pending = [case for case in cases
                           if sum(e["case"] == case[0] for e in entries) < case[5]]
                if not pending:
                    break
                for name, candidate, case_settings, env, wait, wanted in pending:
                    started = time.monotonic()
                    entry = {"case": name, "wait_us": wait, "design": args.design,
                             **_decide(pinned, candidate, case_settings,
                                       {"baseline": plain, "candidate": env})}
                    log.write(json.dumps(entry) + "\n")
                    log.flush()
                    entries.append(entry)
                    done = sum(e["case"] == name for e in entries)
                    print(f"{name} {done}/{wanted}: {entry['verdicts']} in "
                          f"{time.monotonic() - started:.0f} s", flush=True)
    logged = sorted({float(e["case"][3:]) for e in entries if e["case"].startswith("ab-")},
                    reverse=True)
    _report(entries, rule, logged)


def _measure_slowdown(pinned: Arm, slowed: Arm, settings: AbSettings, plain: dict[str, str],
                      wait: int) -> float:
    """1 - the median paired decode ratio of the slowed build with ``wait``, ~20 s."""
    probe = replace(settings, rule=replace(settings.rule, budget_s=20.0), metrics=("decode_tps",))
    outcome = run_ab(pinned, slowed, probe,
                     env={"baseline": plain, "candidate": {**plain, SLOW_DECODE_ENV: str(wait)}})
    return measured_effect(outcome, "decode_tps")


def _wait_for(entries: list[dict[str, Any]], fraction: float, *, pinned: Arm, slowed: Arm,
              settings: AbSettings, plain: dict[str, str]) -> int:
    """The wait (µs per token) that slows decode by ``fraction`` under this design.

    Measured, not computed: under the duet design a short wait costs far less than its
    share of a token's time (measured here: 119 µs, 6 % of a token at 530 tokens/s,
    slowed decode by about 1 %; 250 µs by 6 %), so the formula's wait is only the first
    guess and each guess is corrected by the slowdown it measured. A log that already
    has decisions for ``fraction`` keeps their wait.
    """
    logged = [e["wait_us"] for e in entries if e["case"] == f"ab-{fraction:g}"]
    if logged:
        return int(logged[0])
    wait = wait_for_slowdown(fraction, _measure_decode(pinned, settings.model))
    tried: list[tuple[int, float]] = []
    for _ in range(6):
        measured = _measure_slowdown(pinned, slowed, settings, plain, wait)
        print(f"calibrating {fraction:.0%}: wait {wait} us -> measured slowdown "
              f"{measured:.1%}", flush=True)
        tried.append((wait, measured))
        if abs(measured - fraction) < fraction * 0.15:
            break
        below = [t for t in tried if t[1] < fraction]
        above = [t for t in tried if t[1] >= fraction]
        if below and above:
            # Bracketed: interpolate between the nearest waits on either side.
            (w0, s0), (w1, s1) = max(below), min(above)
            wait = round(w0 + (w1 - w0) * (fraction - s0) / max(s1 - s0, 1e-6))
        else:
            wait = wait * 2 if not above else max(1, wait // 2)
    return min(tried, key=lambda t: abs(t[1] - fraction))[0]


def _measure_decode(pinned: Arm, model: Path) -> float:
    """The pinned build's decode speed now: median of 5 fresh servers (after 2 warm-ups)."""
    assert pinned.binary is not None
    with tempfile.TemporaryDirectory(prefix="ab-detection-") as logs:
        runner = SubprocessRunner(pinned.binary, Path(logs))
        speeds = []
        for _ in range(7):
            server = runner.start(LaunchSpec(model=model, ctx_size=512))
            try:
                speed = measure_speed(server.base_url, DEFAULT_PROMPT_TOKENS,
                                      DEFAULT_GEN_TOKENS, DEFAULT_REPETITIONS).decode_tps
            finally:
                server.stop()
            if speed is not None:
                speeds.append(speed)
    tps = statistics.median(speeds[2:])
    print(f"pinned build decode speed: {tps:.0f} tokens/s (median of {len(speeds) - 2})")
    return tps


if __name__ == "__main__":
    main()
