"""How good is the regression gate's noise rule on this machine?

1. Measures the run-to-run noise of decode tokens/s: each run starts a fresh server on
   the ``bench`` fixture and takes the same measurement every suite server gets (median
   of the repetitions), exactly as a harness run records it.
2. Simulates, at that noise, baselines of ``--baseline-runs`` runs and one candidate,
   many times over: the false-alarm rate with no change, and the detection rate for a
   ``--slowdown`` (default 10 %) decode slowdown, under the default rule (5 % and z 3).
   Targets: at most 1 % false alarms and at least 95 % detection with 5 baseline runs.

The noise is drawn as a normal distribution with the measured coefficient of variation;
``--noise CV`` skips the measurement and simulates at the given CV instead.

    .venv/bin/python benchmarks/detector_quality.py [--runs 15] [--baseline-runs 5]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path

from harness import modelgen
from harness.builds.resolve import ensure_build
from harness.paths import cache_root
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS
from harness.perf.measure import measure_speed
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.results.noise_rule import NoiseRule, judge
from harness.results.rules import FigureStatus
from harness.results.run_record import Direction
from harness.runners.subprocess_runner import SubprocessRunner

SWEEP_CVS = (0.005, 0.01, 0.015, 0.02, 0.03, 0.05, 0.08)


def measure_decode_runs(runs: int, threads: int | None) -> list[float]:
    binary = ensure_build(cache_root(), BuildRequest()).binary
    model = modelgen.ensure_fixtures().model("bench")
    values = []
    with tempfile.TemporaryDirectory(prefix="detector-") as logs:
        runner = SubprocessRunner(binary, Path(logs))
        for number in range(1, runs + 1):
            server = runner.start(LaunchSpec(model=model, ctx_size=512, threads=threads))
            try:
                speed = measure_speed(server.base_url, DEFAULT_PROMPT_TOKENS,
                                      DEFAULT_GEN_TOKENS, DEFAULT_REPETITIONS)
            finally:
                server.stop()
            assert speed.decode_tps is not None, "the server reported no decode speed"
            values.append(speed.decode_tps)
            print(f"  run {number:2}: decode {speed.decode_tps:8.1f} tokens/s", flush=True)
    return values


def simulate(cv: float, baseline_runs: int, slowdown: float, trials: int, *,
             rule: NoiseRule, seed: int = 1) -> tuple[float, float]:
    """(false-alarm rate, detection rate) for a higher-is-better figure with mean 1."""
    rng = random.Random(seed)
    alarms = detections = 0
    for _ in range(trials):
        baseline = [rng.gauss(1.0, cv) for _ in range(baseline_runs)]
        same = rng.gauss(1.0, cv)
        slower = rng.gauss(1.0 - slowdown, cv)
        regressed = FigureStatus.REGRESSED
        if judge(baseline, same, Direction.HIGHER_IS_BETTER, rule).status is regressed:
            alarms += 1
        if judge(baseline, slower, Direction.HIGHER_IS_BETTER, rule).status is regressed:
            detections += 1
    return alarms / trials, detections / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--noise", type=float, default=None,
                        help="simulate at this coefficient of variation; no measuring")
    parser.add_argument("--baseline-runs", type=int, default=5)
    parser.add_argument("--slowdown", type=float, default=0.10)
    parser.add_argument("--trials", type=int, default=20000)
    args = parser.parse_args()

    if args.noise is None:
        print(f"measuring decode tokens/s on the bench fixture, {args.runs} runs "
              f"(pp{DEFAULT_PROMPT_TOKENS}/tg{DEFAULT_GEN_TOKENS}, median of "
              f"{DEFAULT_REPETITIONS}):")
        values = measure_decode_runs(args.runs, args.threads)
        mean = statistics.fmean(values)
        cv = statistics.stdev(values) / mean
        print(f"decode tokens/s: mean {mean:.1f}, stdev {statistics.stdev(values):.1f}, "
              f"min {min(values):.1f}, max {max(values):.1f}, run-to-run CV {cv:.2%}")
    else:
        cv = args.noise
        print(f"simulating at a given CV of {cv:.2%}")

    rule = NoiseRule()
    print(f"rule: change > {rule.threshold:.0%} and z > {rule.z:g}; "
          f"{args.trials} simulated candidates each")
    for runs in sorted({3, args.baseline_runs, 10}):
        alarms, detected = simulate(cv, runs, args.slowdown, args.trials, rule=rule)
        marker = "  <- the target case" if runs == args.baseline_runs else ""
        print(f"  {runs:2} baseline runs: false alarms {alarms:6.2%} (target <= 1%), "
              f"detection of a {args.slowdown:.0%} slowdown {detected:6.2%} "
              f"(target >= 95%){marker}")
    # What a runner's noise must be for the targets: the same simulation over a sweep.
    print(f"the same rule at other noise levels, {args.baseline_runs} baseline runs:")
    for sweep in SWEEP_CVS:
        alarms, detected = simulate(sweep, args.baseline_runs, args.slowdown, args.trials,
                                    rule=rule)
        meets = "meets both targets" if alarms <= 0.01 and detected >= 0.95 else "misses"
        print(f"  CV {sweep:5.1%}: false alarms {alarms:6.2%}, detection {detected:6.2%}"
              f"  {meets}")


if __name__ == "__main__":
    main()
