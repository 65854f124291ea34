"""How much signal a second of ``harness ab`` buys, per sampling technique (A/A).

    .venv/bin/python benchmarks/ab_signal.py [--configs all] [--rounds 3] [--round-s 60]
        [--log ab-signal.jsonl] [--deadline-s S] [--report-only]

Each configuration compares the pinned build with itself (sequential design unless it
says otherwise, the
decode_tps metric, a rule that never decides so every round runs its whole budget), and
the figure of merit is what a gate pays for a decision: the seconds its pairs need for
the 95 % interval of the ratio to narrow to ±1.5 % (half a 3 % threshold). The gate's
own interval (Hodges-Lehmann, signed-rank) is taken on all the configuration's pairs,
each round's centred on its own median, and scaled as 1/sqrt(pairs):
``spp * n * (half-width / ln(1.015))^2`` for ``n`` pairs at ``spp`` seconds a pair,
plus the probe start where one sizes the sampling. The gain of a technique is the plain
configuration's seconds over its own. The pairs' standard deviation is printed beside it
(with its 95 % interval, which says how far to trust a gain): the interval is robust to
an outlier pair, the standard deviation is not.

Configurations (harness/ab/sampling.py, covariate.py, pinning.py):

- ``plain``: what ``harness ab`` measured before (64 decode tokens x 5 completions, no
  warm-up, client unpinned, raw pairs), and, from the same pairs, ``plain+slot``: the
  interval on the log ratios less what the pair's slot explains (CUPED);
- ``tokens``: decode tokens sized to the noise by the probe;
- ``warmup``: warm-up completions cut by measurement (MSER on the probe);
- ``pinned``: the client pinned to the other half of the cores;
- ``large``: the bench-large fixture (about 300 MiB), 16 decode tokens x 3 completions;
- ``alternating``: the alternating design (harness/ab/design.py): both servers of a pair
  resident on one half of the cores, their requests in turns;
- ``machine``: the machine's speed read around each start (harness/ab/machine_speed.py),
  its pairs judged raw (``machine-raw``), by the machine covariate, and by slot and
  machine together;
- ``default``: ``harness ab``'s defaults, and ``default-raw``, the same pairs without
  the covariate.

Configurations go round robin, one round (``--round-s`` of measuring) each in turn, so
drift of the machine lands on all of them alike; every round is appended to ``--log``
(JSONL) when done, so a stopped run resumes, and the table is printed from the whole
log. Run it on a quiet machine: a build beside it is a different machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from harness import modelgen
from harness.ab.covariate import (
    BOTH_COVARIATES,
    MACHINE_COVARIATE,
    NO_COVARIATE,
    SLOT_COVARIATE,
    adjust,
    slot_of,
)
from harness.ab.decision import AbRule
from harness.ab.design import ALTERNATING, SEQUENTIAL
from harness.ab.report import outcome_json
from harness.ab.runner import AbSettings, Arm, run_ab
from harness.ab.stats import log_ratio_interval
from harness.builds.resolve import ensure_build
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.results.rules import AB_COVARIATE, AB_GEN_TOKENS, AB_PIN_CLIENT, AB_WARMUP

METRIC = "decode_tps"
#: The interval half-width a decision needs: half of the 3 % threshold.
TARGET_HALF_WIDTH = math.log(1.015)


@dataclass(frozen=True)
class Config:
    name: str
    fixture: str = "bench"
    overrides: dict[str, Any] = field(default_factory=dict)
    #: Rows judged on this configuration's pairs: the row's name and the covariate it
    #: adjusts them by (harness/ab/covariate.py COVARIATES).
    rows: tuple[tuple[str, str], ...] = ()


CONFIGS = {c.name: c for c in (
    Config("plain", rows=(("plain", NO_COVARIATE), ("plain+slot", SLOT_COVARIATE))),
    Config("tokens", overrides={"n_gen": None}),
    Config("warmup", overrides={"warmup": None}),
    Config("pinned", overrides={"pin_client": True}),
    # A token of bench-large takes about 30 ms on one core here: 16 tokens x 3 keep a
    # start near the plain one's seconds.
    Config("large", fixture=modelgen.LARGE_FIXTURE,
           overrides={"n_gen": 16, "repetitions": 3}),
    Config("alternating", overrides={"design": ALTERNATING},
           rows=(("alternating", NO_COVARIATE), ("alternating+slot", SLOT_COVARIATE))),
    Config("machine", overrides={"covariate": BOTH_COVARIATES},
           rows=(("machine-raw", NO_COVARIATE), ("machine", MACHINE_COVARIATE),
                 ("slot+machine", BOTH_COVARIATES))),
    Config("default", overrides={"n_gen": AB_GEN_TOKENS, "warmup": AB_WARMUP,
                                 "pin_client": AB_PIN_CLIENT, "covariate": AB_COVARIATE},
           rows=(("default", AB_COVARIATE), ("default-raw", NO_COVARIATE))),
)}


def _entries(log: Path) -> list[dict[str, Any]]:
    if not log.is_file():
        return []
    found = []
    for line in log.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill: that round is made again
    return found


def _round(config: Config, arm: Arm, round_s: float) -> dict[str, Any]:
    """One A/A comparison of ``round_s`` seconds: its pairs (with their slots) and times."""
    # min_pairs far past any round: no verdict, so the round runs its whole budget.
    rule = AbRule(budget_s=round_s, min_pairs=10**6)
    settings = replace(AbSettings(model=modelgen.fixture_model(config.fixture),
                                  fixture=config.fixture, metrics=(METRIC,),
                                  design=SEQUENTIAL, rule=rule), **config.overrides)
    started = time.monotonic()
    body = outcome_json(run_ab(arm, replace(arm, label="candidate"), settings))
    by_pair: dict[int, dict[str, dict[str, Any]]] = {}
    for sample in body["samples"]:
        by_pair.setdefault(sample["pair"], {})[sample["arm"]] = sample
    pairs = []
    for arms in by_pair.values():
        if {"baseline", "candidate"} <= set(arms):
            base, cand = arms["baseline"], arms["candidate"]
            slot = slot_of(base["sequence"], cand["sequence"], base["half"], cand["half"])
            machine = (math.log(cand["machine"]) - math.log(base["machine"])
                       if base.get("machine") and cand.get("machine") else None)
            pairs.append((base["values"][METRIC], cand["values"][METRIC], slot,
                          base["at_s"], machine))
    first_pair_at = min((s["at_s"] for s in body["samples"]), default=0.0)
    return {"config": config.name, "pairs": pairs, "elapsed_s": time.monotonic() - started,
            "probe_s": first_pair_at, "n_gen": body["n_gen"], "warmup": body["warmup"]}


@dataclass(frozen=True)
class Figures:
    pairs: int
    seconds_per_pair: float
    probe_s: float
    sd: float
    #: The spread's 95 % interval (chi-square, normal pairs): how far to trust a gain.
    sd_low: float
    sd_high: float
    n_gen: str
    warmup: str

    #: Half the width of the gate's 95 % interval on all the pairs, in log ratio.
    half_width: float

    @property
    def decision_s(self) -> float:
        return self.probe_s + self.seconds_per_pair * self.pairs * (
            self.half_width / TARGET_HALF_WIDTH) ** 2


def _columns(pairs: list[list[Any]], covariate: str) -> list[list[float]] | None:
    """The covariate columns of a round's logged pairs (slot, machine), as the gate's."""
    columns = []
    if covariate in (SLOT_COVARIATE, BOTH_COVARIATES):
        columns.append([float(p[2]) for p in pairs])
    if covariate in (MACHINE_COVARIATE, BOTH_COVARIATES):
        if any(len(p) < 5 or p[4] is None for p in pairs):
            return None
        columns.append([float(p[4]) for p in pairs])
    return columns


def _figures(rounds: list[dict[str, Any]], covariate: str) -> Figures | None:
    # Each round's own covariate adjustment: theta is fitted per comparison, as the gate does.
    logs: list[float] = []
    for entry in rounds:
        diffs = [math.log(p[1]) - math.log(p[0]) for p in entry["pairs"]]
        columns = _columns(entry["pairs"], covariate)
        if columns is None:
            return None
        if columns:
            diffs = list(adjust(diffs, columns).log_ratios)
        # Centred per round: a round's own offset is not spread within a comparison.
        if len(diffs) >= 2:
            centre = statistics.median(diffs)
            logs += [d - centre for d in diffs]
    n = len(logs)
    interval = log_ratio_interval(logs) if n >= 3 else None
    if interval is None:
        return None
    dof = n - len(rounds)
    sd = math.sqrt(sum(d * d for d in logs) / max(1, dof))
    spread = 1.959964 / math.sqrt(2 * max(1, dof))
    pair_s = sum(e["elapsed_s"] - e["probe_s"] for e in rounds) / n
    return Figures(pairs=n, seconds_per_pair=pair_s,
                   probe_s=statistics.fmean(e["probe_s"] for e in rounds),
                   sd=sd, sd_low=sd / (1 + spread), sd_high=sd / max(1e-9, 1 - spread),
                   half_width=(math.log(interval.high) - math.log(interval.low)) / 2,
                   n_gen="/".join(sorted({str(e["n_gen"]) for e in rounds})),
                   warmup="/".join(sorted({str(e["warmup"]) for e in rounds})))


def report(entries: list[dict[str, Any]]) -> None:
    rows: list[tuple[str, Figures]] = []
    for config in CONFIGS.values():
        rounds = [e for e in entries if e["config"] == config.name]
        judged = config.rows or ((config.name,
                                  config.overrides.get("covariate", NO_COVARIATE)),)
        for name, covariate in judged:
            figures = _figures(rounds, covariate)
            if figures is not None:
                rows.append((name, figures))
    plain = next((f for n, f in rows if n == "plain"), None)
    print(f"{'config':12} {'pairs':>5} {'s/pair':>6} {'probe s':>7} {'tokens':>7} "
          f"{'warm-up':>7} {'sd %':>6} {'sd 95% CI':>13} {'s to ±1.5%':>10} {'gain':>5}")
    for name, f in rows:
        gain = f"{plain.decision_s / f.decision_s:.2f}" if plain is not None else "-"
        print(f"{name:12} {f.pairs:5d} {f.seconds_per_pair:6.2f} {f.probe_s:7.1f} "
              f"{f.n_gen:>7} {f.warmup:>7} {100 * f.sd:6.2f} "
              f"{100 * f.sd_low:6.2f}-{100 * f.sd_high:<6.2f} {f.decision_s:10.0f} {gain:>5}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default="all",
                        help=f"comma-separated, of {', '.join(CONFIGS)}")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per configuration")
    parser.add_argument("--round-s", type=float, default=60.0,
                        help="seconds of measuring per round")
    parser.add_argument("--log", type=Path, default=Path("ab-signal.jsonl"))
    parser.add_argument("--deadline-s", type=float, default=math.inf,
                        help="start no round after this many seconds")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    names = list(CONFIGS) if args.configs == "all" else args.configs.split(",")
    unknown = sorted(set(names) - set(CONFIGS))
    if unknown:
        raise SystemExit(f"--configs: unknown {', '.join(unknown)}")
    if not args.report_only:
        arm = Arm("baseline", binary=ensure_build(cache_root(), BuildRequest()).binary)
        entries = _entries(args.log)
        started = time.monotonic()
        while time.monotonic() - started < args.deadline_s:
            pending = [n for n in names
                       if sum(e["config"] == n for e in entries) < args.rounds]
            if not pending:
                break
            # The configuration with the fewest rounds next: round robin, resumable.
            name = min(pending, key=lambda n: sum(e["config"] == n for e in entries))
            entry = _round(CONFIGS[name], arm, args.round_s)
            with args.log.open("a") as out:
                out.write(json.dumps(entry) + "\n")
            entries.append(entry)
            print(f"{name}: {len(entry['pairs'])} pairs in {entry['elapsed_s']:.0f} s",
                  flush=True)
    report(_entries(args.log))


if __name__ == "__main__":
    main()
