"""How much slower is the slowed build, per wait, against the pinned CPU build?

The slowed build (``harness/builds/slowed.py``) spins ``HARNESS_SLOW_DECODE_US``
microseconds after each generated token. This benchmark measures what a wait really
costs on this machine, so the A/B detection benchmark knows each true slowdown:

1. After ``--warmup`` uncounted runs (the first servers after a quiet spell decode
   slower here: measured, a pilot without them ran 10-20 % below the rounds), a few
   pilot runs of the pinned build give its median decode tokens/s; the waits for each
   ``--targets`` slowdown come from it through ``wait_for_slowdown``.
2. ``--rounds`` rounds each start the pinned build once and the slowed build once per
   wait (and once with the variable unset), in an order rotated every round so neither
   arm always runs first. Each run is a fresh server on the ``bench`` fixture measured
   exactly as a suite server is (median of the repetitions).
3. Per wait: both medians, the slowdown of the medians (1 - slowed/baseline) against the
   target, and the spread of the per-round slowdowns (each slowed run against the
   baseline run of its own round).

    .venv/bin/python benchmarks/slowed_calibration.py [--rounds 5] [--targets 0.05,0.10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness import modelgen
from harness.builds.resolve import ensure_build
from harness.builds.slowed import (
    SLOW_DECODE_ENV,
    ensure_slowed_build,
    slowed_env,
    wait_for_slowdown,
)
from harness.paths import cache_root
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS
from harness.perf.measure import measure_speed
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners.subprocess_runner import SubprocessRunner

BASELINE = "baseline"


@dataclass
class Arm:
    """One way of starting a server, and the decode speed of each of its runs."""

    label: str
    runner: SubprocessRunner
    target: float | None = None
    wait_us: int | None = None
    speeds: list[float] = field(default_factory=list)


def decode_tps(runner: SubprocessRunner, model: Path, threads: int | None) -> float:
    server = runner.start(LaunchSpec(model=model, ctx_size=512, threads=threads))
    try:
        speed = measure_speed(server.base_url, DEFAULT_PROMPT_TOKENS, DEFAULT_GEN_TOKENS,
                              DEFAULT_REPETITIONS)
    finally:
        server.stop()
    if speed.decode_tps is None:
        raise RuntimeError(f"the server of {runner.binary} reported no decode speed")
    return speed.decode_tps


def run_rounds(arms: list[Arm], rounds: int, model: Path, threads: int | None) -> None:
    for number in range(rounds):
        shift = number % len(arms)
        for arm in arms[shift:] + arms[:shift]:
            arm.speeds.append(decode_tps(arm.runner, model, threads))
        print(f"  round {number + 1:2}: " + ", ".join(
            f"{arm.label} {arm.speeds[-1]:.1f}" for arm in arms), flush=True)


def report(baseline: Arm, slowed: list[Arm]) -> None:
    base_median = statistics.median(baseline.speeds)
    print(f"baseline (pinned build): median decode {base_median:.1f} tokens/s, "
          f"min {min(baseline.speeds):.1f}, max {max(baseline.speeds):.1f}")
    for arm in slowed:
        median = statistics.median(arm.speeds)
        paired = [1.0 - s / b for s, b in zip(arm.speeds, baseline.speeds, strict=True)]
        target = ""
        if arm.target is not None and arm.wait_us is not None:
            # The pilot set the wait; the machine may have sped up or slowed down since,
            # so also say what this wait should cost at the baseline measured alongside.
            expected = arm.wait_us / (1e6 / base_median + arm.wait_us)
            target = f"target {arm.target:5.1%} (at this baseline {expected:5.1%}), "
        print(f"  {arm.label:>14}: {target}median decode {median:7.1f} tokens/s, "
              f"true slowdown {1.0 - median / base_median:6.1%} "
              f"(per round: median {statistics.median(paired):6.1%}, "
              f"min {min(paired):6.1%}, max {max(paired):6.1%}, "
              f"stdev {statistics.stdev(paired) if len(paired) > 1 else 0.0:5.1%})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2,
                        help="uncounted baseline runs before the pilot")
    parser.add_argument("--pilot", type=int, default=3,
                        help="baseline runs that set the waits")
    parser.add_argument("--targets", default="0.05,0.10",
                        help="comma-separated decode slowdowns to calibrate")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    targets = [float(t) for t in args.targets.split(",") if t.strip()]

    # The pinned binary has no wait to read, but keep the variable out of every arm
    # except those that set it, so "unset" really is unset.
    os.environ.pop(SLOW_DECODE_ENV, None)
    cache = cache_root()
    baseline_binary = ensure_build(cache, BuildRequest()).binary
    slowed_binary = ensure_slowed_build(cache).binary
    model = modelgen.ensure_fixtures().model("bench")
    print(f"baseline {baseline_binary}\nslowed   {slowed_binary}")
    print(f"bench fixture, pp{DEFAULT_PROMPT_TOKENS}/tg{DEFAULT_GEN_TOKENS}, "
          f"median of {DEFAULT_REPETITIONS} per run, threads {args.threads or 'default'}")

    with tempfile.TemporaryDirectory(prefix="slowed-calibration-") as logs:
        baseline = Arm(BASELINE, SubprocessRunner(baseline_binary, Path(logs)))
        for _ in range(args.warmup):
            decode_tps(baseline.runner, model, args.threads)
        pilot = [decode_tps(baseline.runner, model, args.threads) for _ in range(args.pilot)]
        pilot_median = statistics.median(pilot)
        print(f"pilot: baseline median decode {pilot_median:.1f} tokens/s "
              f"({', '.join(f'{p:.1f}' for p in pilot)})")
        slowed = [Arm("slowed, unset", SubprocessRunner(slowed_binary, Path(logs)))]
        for target in targets:
            wait = wait_for_slowdown(target, pilot_median)
            runner = SubprocessRunner(slowed_binary, Path(logs), env=slowed_env(wait))
            slowed.append(Arm(f"wait {wait} us", runner, target=target, wait_us=wait))
        print(f"{args.rounds} rounds, order rotated each round:")
        run_rounds([baseline, *slowed], args.rounds, model, args.threads)
    report(baseline, slowed)


if __name__ == "__main__":
    main()
