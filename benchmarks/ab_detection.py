"""How good is ``harness ab`` on this machine, per kind of slowdown and per design,
against ground truth measured solo?

    .venv/bin/python benchmarks/ab_detection.py [--kinds all] [--levels 0.10]
        [--designs sequential,interleaved,duet] [--decisions sequential=20,duet=6,...]
        [--aa 0] [--aa-neighbour 0] [--aa-patched 0] [--sampling gate|plain]
        [--n-prompt 32] [--ttft-prompt auto] [--log ab-detection.jsonl ...]
        [--budget-s 180] [--extend-s 180]
        [--deadline-s S] [--report-only]

For each kind of slowdown the slowed build carries (harness/builds/slowed.py SLOWDOWNS)
and each level (a fraction: 0.10 is 10 % worse on the metric the kind moves):

1. **Sizing, solo.** The kind's amount is sized on the sequential design — one server
   at a time, both arms pinned to the same half of the cores with the same threads,
   order and half by coin flips, fresh servers — never on a design under test: a first
   guess from the baseline's own figure, then corrected in proportion to the effect
   each probe measured. A kind with a fixed amount (``threads``) is measured as it is.
2. **Decisions.** ``harness ab``'s rule decides the kind's metric with each design
   (every metric counted as validated, so a design's own "unchanged" shows: that is
   what this benchmark exists to catch). Every start still measures every metric, and
   each decision's pairs are judged for every metric afterwards: the metrics a change
   was attributed to.
3. **Truth.** The kind's true size at a level is the median candidate/baseline ratio
   of every sequential pair measured at that amount (its sizing probe and its sequential
   decisions) — the solo measurement, with the 95 % interval of that median. Each
   design's measured effect (the median of its own pairs) is printed beside it as a
   ratio: 1.0 keeps the size, below 1 compresses.
   The decode wait also has a **constructed** truth that needs no difference of two
   noisy speeds: the wait is wall time added to every token, so a pair whose baseline
   decoded at b tokens/s is slowed by exactly w·b / (1 + w·b) (harness/builds/slowed.py
   ``slowdown_of_wait``). Its median over the solo pairs' baselines has an interval
   about as narrow as the baseline speed's own median, well under the size; the solo
   measurement beside it checks the construction. The decode wait is sized by that
   construction from the baseline's speed, without probes (a 40 s probe's own spread,
   ±4 % here, would move a 3 % size more than it corrects it). Where ``--truth-s``'s
   solo run settles the size away from the level (on four of seven VMs a wait cost more
   than its length), the wait is sized once more from its solo cost per µs
   (benchmarks/ab_solo_sizing.py) and measured solo again; the decisions use that wait.

``--aa N`` adds N A/A decisions per design (the pinned build as both arms): false alarms;
``--aa-neighbour N`` N more, each beside a noisy neighbour (benchmarks/noisy_neighbour.py:
a build of the pinned tree looping on the same cores), row ``aa+build``;
``--aa-patched N`` N more with the slowed build, every slowdown unset, as the candidate,
row ``aa+patch``: the patch's own cost, which the decode wait's constructed truth takes
to be nil (the patch touches the decode loop and ggml-cpu.c, so the compiler may lay the
hot code out differently). Each A/A row's pairs give their median effect and its
interval under the table: about 0 for a plain A/A, the patch's cost for ``aa+patch``.
Each A/A row is
also **replayed**: 1000 decisions redrawn from its recorded pairs (each with its
covariate values) and judged block by block as the gate judges, which bounds the false
alarm rate far below what 20 measured decisions can (0 of 20 only says under 16 %), at
the price of independent draws.
``--sampling gate`` (the default) measures as ``harness ab`` does by default: the
warm-up sized by a probe start, the client pinned, the machine covariate
(harness/ab/sampling.py, covariate.py); ``plain`` as logs made before those did (64
tokens x 5 completions, raw pairs). Its cells are labelled ``.../gate``.
``--n-prompt N`` times the completions with an N-token prompt and ``--ttft-prompt N|auto``
the first token (``harness ab``'s options; auto: sized by a probe start, about 1024 tokens
here). On a 32-token first-token prompt ``ttft_ms`` is about 16 ms here, so a 10 %
first-token change (1.6 ms) is under the metric's 5 ms floor; at 1024 tokens it is about
300 ms. Cells, sizes and truths are kept apart per pair of prompt settings.
Every probe and decision is appended to ``--log`` (JSONL) when made, so a stopped run
resumes; the table judges each decision's pairs again with today's rule (a log made
before a rule change reads as the rule now decides); decisions go round robin over the
cells (kind, level, design), so a run cut short by ``--deadline-s`` has figures for
each. The table is printed from the whole log. A log is one machine's: its amounts
are sized on that machine's speed, so a run resumes a log only on the machine that
began it. ``--report-only`` with ``--log`` given once per machine prints each log's
table and then each cell's verdicts pooled over the logs (benchmarks/results/ keeps the
logs of the runs docs/ab.md reports).
Targets: detection >= 95 % at a true 10 %, >= 80 % at 5 %; false alarms <= 1 %; median
decision <= 90 s.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ab_by_size import print_by_size
from ab_solo_sizing import median_interval, resized_wait
from ab_table import median_time_text, rate_text
from noisy_neighbour import NoisyNeighbour

from harness import modelgen
from harness.ab.covariate import chosen_columns, machine_ratio, slot_of
from harness.ab.decision import (
    AB_EXTEND_S,
    AbRule,
    AbVerdict,
    decide_metric,
    resampled_false_alarm_rate,
)
from harness.ab.design import DESIGNS, SEQUENTIAL
from harness.ab.design_check import amount_for
from harness.ab.report import outcome_json
from harness.ab.runner import AB_METRICS, AbSettings, Arm, run_ab
from harness.ab.stats import wilson_interval
from harness.ab.validation import effect
from harness.builds.resolve import ensure_build
from harness.builds.slowed import (
    SLOWDOWN_BY_NAME,
    SLOWDOWNS,
    ensure_slowed_build,
    slowdown_env,
    slowdown_of_wait,
)
from harness.builds.source import fetch_pinned_source
from harness.errors import ServerError
from harness.paths import cache_root
from harness.perf.keys import DEFAULT_PROMPT_TOKENS
from harness.planning.build_plan import BuildRequest
from harness.results.rules import AB_COVARIATE, AB_GEN_TOKENS, AB_PIN_CLIENT, AB_WARMUP
from harness.results.run_record import METRICS, Direction

TARGET_DETECTION = {0.10: 0.95, 0.05: 0.80}
TARGET_FALSE_ALARMS = 0.01
TARGET_DECISION_S = 90.0
DEFAULT_DECISIONS = {SEQUENTIAL: 20, "interleaved": 6, "duet": 6}
#: A sizing probe is close enough within this share of the level (10 % at 0.10: 9-11 %).
SIZE_TOLERANCE = 0.15
#: Each sizing probe: one sequential comparison of the kind's metric, at most this long.
PROBE_BUDGET_S = 40.0
#: Kinds whose amount is not a size: measured at this amount, whatever the level. A
#: build that ignores ``--threads`` shows only where it uses more threads than a design
#: gives (interleaved gives every core): twice the cores is more than any design gives.
FIXED_AMOUNTS = {"threads": 2 * len(os.sched_getaffinity(0))}
#: Kinds whose size follows from the amount and the baseline's speed alone (a wall-time
#: wait per token): sized and given a constructed truth without probes.
CONSTRUCTED = frozenset({"decode-wait"})
#: A/A decisions replayed from each A/A cell's recorded pairs: 0 alarms in 1000 bounds
#: the rate under 0.4 % (Wilson, 95 %).
REPLAY_TRIALS = 1000
#: What a logged decision keeps per metric: each pair's (baseline, candidate) figures,
#: and each covariate column the gate could adjust them by.
Pairs = dict[str, list[tuple[float, float]]]
Columns = dict[str, list[float]]


def _higher_is_better(metric: str) -> bool:
    return METRICS[metric].direction is Direction.HIGHER_IS_BETTER


def _entries(log: Path) -> list[dict[str, Any]]:
    if not log.is_file():
        return []
    found = []
    for line in log.read_text().splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue  # a line cut by a kill: that step is made again
    return found


def _pairs_by_metric(body: dict[str, Any]) -> tuple[Pairs, Columns, Columns]:
    """Each metric's (baseline, candidate) pairs of one comparison's JSON samples, and in
    the same order each pair's slot and its machine covariate (the log ratio of the
    machine's speed around the two starts: harness/ab/covariate.py); a metric with a
    start the machine was not read for has no machine column."""
    by_pair: dict[int, dict[str, dict[str, Any]]] = {}
    for sample in body["samples"]:
        by_pair.setdefault(sample["pair"], {})[sample["arm"]] = sample
    pairs: Pairs = {}
    slots: Columns = {}
    machine: dict[str, list[float | None]] = {}
    for pair in sorted(by_pair):
        arms = by_pair[pair]
        if {"baseline", "candidate"} <= set(arms):
            base, cand = arms["baseline"], arms["candidate"]
            slot = slot_of(base["sequence"], cand["sequence"], base["half"], cand["half"])
            moved = machine_ratio(base.get("machine"), cand.get("machine"))
            for metric in AB_METRICS:
                if metric in base["values"] and metric in cand["values"]:
                    pairs.setdefault(metric, []).append(
                        (base["values"][metric], cand["values"][metric]))
                    slots.setdefault(metric, []).append(slot)
                    machine.setdefault(metric, []).append(moved)
    read = {metric: [m for m in column if m is not None]
            for metric, column in machine.items() if None not in column}
    return pairs, slots, read


def _median_effect(pairs: Iterable[tuple[float, float]], metric: str) -> float | None:
    ratios = [c / b for b, c in pairs]
    if not ratios:
        return None
    return effect(statistics.median(ratios), _higher_is_better(metric))


def _attribution(pairs: Pairs, rule: AbRule,
                 covariates: dict[str, list[list[float]]]) -> dict[str, str]:
    """Every metric judged on the decision's pairs (adjusted by the covariate columns the
    comparison used): where the change shows."""
    found = {}
    for metric, metric_pairs in pairs.items():
        baseline = [b for b, _ in metric_pairs]
        candidate = [c for _, c in metric_pairs]
        found[metric] = decide_metric(metric, baseline, candidate, rule,
                                      covariates.get(metric)).verdict.value
    return found


def _entry_covariates(entry: dict[str, Any]) -> dict[str, list[list[float]]]:
    """Per metric, the covariate columns a logged decision's rule adjusted by, as the gate
    takes them (harness/ab/covariate.py covariates_for): none for raw pairs, and none
    for a metric whose machine speed was not read (or a log from before it was kept)."""
    used = str(entry.get("covariate"))
    slots: Columns = entry.get("slots", {})
    machine: Columns = entry.get("machine", {})
    found: dict[str, list[list[float]]] = {}
    for metric in entry["pairs"]:
        columns = chosen_columns(used, partial(slots.__getitem__, metric),
                                 partial(machine.get, metric))
        if columns:
            found[metric] = columns
    return found


@dataclass(frozen=True)
class Cell:
    kind: str  # a SLOWDOWNS name, "aa", or "aa+build" (A/A beside a noisy neighbour)
    level: float
    design: str
    #: The prompt settings: "N/M" (timed prompt N, first-token prompt M or auto).
    prompts: str = f"{DEFAULT_PROMPT_TOKENS}/auto"

    @property
    def metric(self) -> str:
        return "decode_tps" if _is_aa(self.kind) else SLOWDOWN_BY_NAME[self.kind].moves


#: ``--log``'s default: one machine's log, in the working folder.
DEFAULT_LOG = Path("ab-detection.jsonl")
#: ``--sampling``: ``harness ab``'s defaults (the probe sizes decode tokens and warm-up,
#: the client is pinned, the machine covariate), or the plain measurement logs before them
#: used (64 tokens x 5, no warm-up, raw pairs).
GATE_SAMPLING, PLAIN_SAMPLING = "gate", "plain"
SAMPLINGS: dict[str, dict[str, Any]] = {
    GATE_SAMPLING: {"n_gen": AB_GEN_TOKENS, "warmup": AB_WARMUP,
                    "pin_client": AB_PIN_CLIENT, "covariate": AB_COVARIATE},
    PLAIN_SAMPLING: {},
}


#: The A/A cell measured beside a noisy neighbour (benchmarks/noisy_neighbour.py).
AA_NEIGHBOUR = "aa+build"
#: The A/A row whose candidate is the slowed build with every slowdown unset.
AA_PATCHED = "aa+patch"


def _is_aa(kind: str) -> bool:
    return kind in ("aa", AA_NEIGHBOUR, AA_PATCHED)


class Bench:
    """The arms, the fixture and the log: every measurement this benchmark makes."""

    def __init__(self, log: Path, rule: AbRule, n_prompt: int,
                 ttft_prompt: int | None, sampling: str = GATE_SAMPLING) -> None:
        cache = cache_root()
        self.pinned = Arm("baseline", binary=ensure_build(cache, BuildRequest()).binary)
        self.slowed = Arm("candidate", binary=ensure_slowed_build(cache).binary)
        self.model = modelgen.ensure_fixtures().model("bench")
        self.rule = rule
        self.n_prompt = n_prompt
        self.ttft_prompt = ttft_prompt
        self.prompts = f"{n_prompt}/{'auto' if ttft_prompt is None else ttft_prompt}"
        # Logs made before the gate sized its sampling measured plain: their label.
        self.sampling = SAMPLINGS[sampling]
        if sampling != PLAIN_SAMPLING:
            self.prompts += f"/{sampling}"
        self.plain = {k: v for k, v in os.environ.items()
                      if k not in {kind.env for kind in SLOWDOWNS}}
        self.log = log
        self.entries = _entries(log)
        self._baseline: dict[str, float] | None = None
        self._baseline_ttft_prompt: int | None = None

    def _append(self, entry: dict[str, Any]) -> None:
        with self.log.open("a") as out:
            out.write(json.dumps(entry) + "\n")
        self.entries.append(entry)

    def compare(self, kind: str, amount: int, design: str, metric: str,
                budget_s: float | None = None) -> dict[str, Any]:
        """One comparison deciding ``metric``; every metric's pairs are kept."""
        # A probe's budget is its own: no extension past it.
        rule = (self.rule if budget_s is None
                else replace(self.rule, budget_s=budget_s, extend_s=0.0))
        ttft_prompt = self.ttft_prompt
        if ttft_prompt is None and metric != "ttft_ms" and self._baseline is not None:
            # Deciding another metric, a comparison sizes no first-token prompt; every
            # start still times the first token, on the length `harness ab`'s default
            # (all four metrics) would use: the baseline probe's.
            ttft_prompt = self._baseline_ttft_prompt
        settings = AbSettings(model=self.model, fixture="bench", rule=rule, design=design,
                              metrics=(metric,), validated=frozenset(AB_METRICS),
                              n_prompt=self.n_prompt, ttft_prompt=ttft_prompt,
                              **self.sampling)
        if kind == AA_PATCHED:
            candidate, env = self.slowed, self.plain
        elif _is_aa(kind):
            candidate, env = replace(self.pinned, label="candidate"), self.plain
        else:
            candidate = self.slowed
            env = slowdown_env(SLOWDOWN_BY_NAME[kind], amount, self.plain)
        body = outcome_json(run_ab(self.pinned, candidate, settings,
                                   env={"baseline": self.plain, "candidate": env}))
        decided = body["metrics"][0]
        pairs, slots, machine = _pairs_by_metric(body)
        result = {"prompts": self.prompts, "ttft_prompt": body.get("ttft_prompt"),
                  "verdict": decided["verdict"],
                  "decided_after_s": decided["decided_after_s"],
                  "elapsed_s": body["elapsed_s"], "extended_s": body["extended_s"],
                  # The replay of A/A decisions runs as long as this run's rule allowed.
                  "budget_s": rule.budget_s, "extend_s": rule.extend_s,
                  "seed": body["seed"],
                  "effect": _median_effect(pairs.get(metric, []), metric),
                  "covariate": settings.covariate, "slots": slots, "machine": machine,
                  "n_gen": body["n_gen"], "warmup": body["warmup"],
                  "pairs": pairs}
        result["attribution"] = _attribution(pairs, self.rule, _entry_covariates(result))
        return result

    def baseline_figures(self) -> dict[str, float]:
        """The pinned build's medians under the sequential design (one A/A block)."""
        if self._baseline is None:
            logged = [e for e in self.entries
                      if e["case"] == "baseline" and _prompt(e) == self.prompts]
            if logged:
                self._baseline = logged[-1]["figures"]
                self._baseline_ttft_prompt = logged[-1].get("ttft_prompt")
            else:
                # Deciding ttft_ms: its first token is timed on the prompt a comparison
                # of the kind would use (auto: the probe's); every metric is measured.
                probe = self.compare("aa", 0, SEQUENTIAL, "ttft_ms", budget_s=1.0)
                figures = {m: statistics.median(b for b, _ in p)
                           for m, p in probe["pairs"].items()}
                self._append({"case": "baseline", "prompts": self.prompts,
                              "figures": figures, "ttft_prompt": probe["ttft_prompt"]})
                self._baseline = figures
                self._baseline_ttft_prompt = probe["ttft_prompt"]
        return self._baseline

    def size(self, kind: str, level: float) -> int:
        """The amount of ``kind`` that makes its metric ``level`` worse, sized solo."""
        sized = [e for e in self.entries if e["case"] == "sized" and e["kind"] == kind
                 and e["level"] == level and _prompt(e) == self.prompts]
        if sized:
            return int(sized[-1]["amount"])
        metric = SLOWDOWN_BY_NAME[kind].moves
        if kind in FIXED_AMOUNTS:
            amount = FIXED_AMOUNTS[kind]
            self._probe(kind, level, amount, metric)
        elif kind in CONSTRUCTED:
            amount = self._first_guess(kind, level)
        else:
            amount = self._first_guess(kind, level)
            tried: list[tuple[int, float]] = []
            for _ in range(5):
                measured = self._probe(kind, level, amount, metric)
                tried.append((amount, measured))
                if abs(measured - level) <= SIZE_TOLERANCE * level:
                    break
                # Each kind's cost grows about linearly with its amount: correct in
                # proportion, at most 4x a step (a tiny measured effect is mostly noise).
                scale = min(4.0, max(0.25, level / max(measured, 1e-3)))
                amount = max(1, round(amount * scale))
                if any(amount == a for a, _ in tried):
                    break  # an integer amount that cannot get closer (memory: MiB)
            amount = min(tried, key=lambda t: abs(t[1] - level))[0]
        self._append({"case": "sized", "kind": kind, "level": level, "amount": amount,
                      "prompts": self.prompts})
        return amount

    def _probe(self, kind: str, level: float, amount: int, metric: str, *,
               budget_s: float = PROBE_BUDGET_S, case: str = "probe") -> float:
        result = self.compare(kind, amount, SEQUENTIAL, metric, budget_s=budget_s)
        self._append({"case": case, "kind": kind, "level": level, "amount": amount,
                      **result})
        measured = result["effect"] if result["effect"] is not None else 0.0
        print(f"sizing {kind} at {level:.0%}: amount {amount} -> solo effect "
              f"{measured:.1%} on {metric}", flush=True)
        return float(measured)

    def _first_guess(self, kind: str, level: float) -> int:
        figures = self.baseline_figures()
        if kind in ("decode-wait", "prompt", "first-token"):
            metric = SLOWDOWN_BY_NAME[kind].moves
            return amount_for(kind, level, figures[metric])
        token_s = 1.0 / figures["decode_tps"]
        extra_s = token_s * level / (1.0 - level)
        if kind == "memory":  # MiB written a token, at about 5 GB/s from one core
            return max(1, round(extra_s * 5e9 / 2**20))
        # matmul: dependent multiply-adds (~1.3 ns each) over ~40 mul_mats a token.
        return max(1, round(extra_s / 40 / 1.3e-9))

    def solo(self, kind: str, level: float, seconds: float) -> None:
        """One more solo (sequential) comparison of ``seconds`` at the sized amount, once
        per kind and level: pairs for the true size beside the sizing probes'.

        A constructed kind whose solo size settles away from the level (its interval
        excludes it) is sized once more from what the wait cost solo
        (benchmarks/ab_solo_sizing.py) and measured solo again at the new amount, which
        the decisions then use."""
        amount = self.size(kind, level)
        self._truth(kind, level, amount, seconds)
        if kind not in CONSTRUCTED or self._sized_times(kind, level) > 1:
            return  # sized again once at most: the second solo run is the truth either way
        cell = Cell(kind, level, SEQUENTIAL, self.prompts)
        resized = resized_wait(amount, level, list(_solo_pairs(self.entries, cell, amount)))
        if resized is None or resized == amount:
            return
        print(f"solo {kind} at {level:.0%}: the {amount} µs wait missed the level solo; "
              f"measuring {resized} µs instead", flush=True)
        self._append({"case": "sized", "kind": kind, "level": level, "amount": resized,
                      "resized_from": amount, "prompts": self.prompts})
        self._truth(kind, level, resized, seconds)

    def _sized_times(self, kind: str, level: float) -> int:
        return sum(1 for e in self.entries if e["case"] == "sized" and e["kind"] == kind
                   and e["level"] == level and _prompt(e) == self.prompts)

    def _truth(self, kind: str, level: float, amount: int, seconds: float) -> None:
        """The solo comparison of ``seconds`` at ``amount``, unless the log has it."""
        if any(e["case"] == "truth" and e["kind"] == kind and e["level"] == level
               and e["amount"] == amount and _prompt(e) == self.prompts
               for e in self.entries):
            return
        metric = SLOWDOWN_BY_NAME[kind].moves
        # A rule that never decides: the comparison runs its whole budget.
        rule, self.rule = self.rule, replace(self.rule, min_pairs=10**6)
        try:
            measured = self._probe(kind, level, amount, metric, budget_s=seconds,
                                   case="truth")
        finally:
            self.rule = rule
        print(f"solo {kind} at {level:.0%}: amount {amount} -> {measured:.1%} over "
              f"{seconds:.0f} s", flush=True)
        if kind in CONSTRUCTED:
            cell = Cell(kind, level, SEQUENTIAL, self.prompts)
            extra = _us_text(_extra_token_us(_solo_pairs(self.entries, cell, amount)))
            print(f"  the wait is {amount} µs a token; solo pairs measured {extra} a token",
                  flush=True)

    def decide(self, cell: Cell) -> dict[str, Any]:
        self.baseline_figures()  # the first-token prompt every comparison times
        amount = 0 if _is_aa(cell.kind) else self.size(cell.kind, cell.level)
        started = time.monotonic()
        try:
            if cell.kind == AA_NEIGHBOUR:
                with NoisyNeighbour(fetch_pinned_source(cache_root()).path):
                    result = self.compare(cell.kind, amount, cell.design, cell.metric)
            else:
                result = self.compare(cell.kind, amount, cell.design, cell.metric)
        except ServerError as exc:
            # A server that died is a finding, not the end of the run: logged and shown.
            failed = {"case": "failure", "kind": cell.kind, "level": cell.level,
                      "design": cell.design, "amount": amount, "prompts": self.prompts,
                      "error": str(exc)}
            self._append(failed)
            print(f"{cell.kind} {cell.level:.0%} {cell.design}: FAILED: {exc}", flush=True)
            return failed
        entry = {"case": "decision", "kind": cell.kind, "level": cell.level,
                 "design": cell.design, "amount": amount, "metric": cell.metric, **result}
        self._append(entry)
        measured = "none" if result["effect"] is None else f"{result['effect']:.1%}"
        print(f"{cell.kind} {cell.level:.0%} {cell.design}: {result['verdict']} (effect "
              f"{measured}) in {time.monotonic() - started:.0f} s", flush=True)
        return entry


def _prompt(entry: dict[str, Any]) -> str:
    """An entry's prompt settings, "N/M" (entries logged before ``--ttft-prompt`` timed
    the first token on the timed prompt; before ``--n-prompt``, on the default)."""
    if "prompts" in entry:
        return str(entry["prompts"])
    n_prompt = int(entry.get("n_prompt", DEFAULT_PROMPT_TOKENS))
    return f"{n_prompt}/{n_prompt}"


def _decisions(entries: list[dict[str, Any]], cell: Cell,
               case: str = "decision") -> list[dict[str, Any]]:
    return [e for e in entries if e["case"] == case and e["kind"] == cell.kind
            and e["level"] == cell.level and e["design"] == cell.design
            and _prompt(e) == cell.prompts]


def _solo_pairs(entries: list[dict[str, Any]], cell: Cell,
                amount: int) -> Iterator[tuple[float, float]]:
    """Every sequential pair of the cell's metric at ``amount``: probes and decisions."""
    for entry in entries:
        if (entry["case"] in ("probe", "truth", "decision") and entry["kind"] == cell.kind
                and entry["level"] == cell.level and entry["amount"] == amount
                and _prompt(entry) == cell.prompts
                and entry.get("design", SEQUENTIAL) == SEQUENTIAL):
            yield from (tuple(p) for p in entry["pairs"].get(cell.metric, []))


def _interval_text(values: list[float]) -> str:
    found = median_interval(values)
    if found is None:
        return "—"
    middle, low, high = found
    return f"{middle:.1%} ({low:.1%} to {high:.1%})"


def _truths(entries: list[dict[str, Any]], cell: Cell, amount: int) -> tuple[str, str]:
    """The solo true size (median pair effect, its interval) and, for a constructed
    kind, the size the amount makes of each solo pair's baseline speed."""
    pairs = list(_solo_pairs(entries, cell, amount))
    higher = _higher_is_better(cell.metric)
    solo = _interval_text([effect(c / b, higher) for b, c in pairs])
    if cell.kind not in CONSTRUCTED:
        return solo, "—"
    return solo, _interval_text([slowdown_of_wait(amount, b) for b, _ in pairs])


def _extra_token_us(pairs: Iterable[tuple[float, float]]) -> list[float]:
    """Microseconds a token took longer in the candidate, pair by pair (decode speeds):
    what a wait per token should add exactly, if the construction holds."""
    return [1e6 / c - 1e6 / b for b, c in pairs]


def _us_text(values: list[float]) -> str:
    found = median_interval(values)
    if found is None:
        return "too few pairs"
    middle, low, high = found
    return f"{middle:+.0f} µs ({low:+.0f} to {high:+.0f})"


def _cells(entries: list[dict[str, Any]]) -> list[Cell]:
    """The log's cells with a decision, in the table's order."""
    return sorted({Cell(e["kind"], e["level"], e["design"], _prompt(e)) for e in entries
                   if e["case"] == "decision"},
                  key=lambda c: (_is_aa(c.kind), c.kind, c.prompts, -c.level,
                                 DESIGNS.index(c.design)))


def _judged_today(decision: dict[str, Any]) -> dict[str, str]:
    """A logged decision's pairs judged for every metric with today's rule (a log made
    before a rule change reads as the rule now decides)."""
    return _attribution(decision["pairs"], AbRule(), _entry_covariates(decision))


def _kind_label(cell: Cell) -> str:
    """The cell's kind, with its prompt settings where they are not the default."""
    return (cell.kind if cell.prompts == Cell.prompts
            else f"{cell.kind} (prompts {cell.prompts})")


def pooled_report(logs: dict[str, list[dict[str, Any]]]) -> None:
    """Each cell's decisions over several logs (machines), judged with today's rule.

    Only the verdicts and times pool: each log sized its own amount on its own machine
    for the same level, so the truths stay in each log's own table."""
    cells = _cells([e for entries in logs.values() for e in entries])
    print(f"\nPooled over {len(logs)} logs ({', '.join(logs)}):")
    print("\n| kind | level | design | decisions (per log) | regressed (95 %) | unchanged | "
          "unknown | decision (median) | extended past the budget |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for cell in cells:
        per_log = [_decisions(entries, cell) for entries in logs.values()]
        done = [e for found in per_log for e in found]
        verdicts = Counter(_judged_today(e)[cell.metric] for e in done)
        print(f"| {_kind_label(cell)} | {cell.level:.0%} | {cell.design} | {len(done)} "
              f"({' + '.join(str(len(found)) for found in per_log)}) | "
              f"{rate_text(verdicts['regressed'], len(done))} | {verdicts['unchanged']} | "
              f"{verdicts['unknown']} | {median_time_text(done)} | {_extensions(done)} |")
    _by_size([e for entries in logs.values() for e in entries])


def _by_size(entries: list[dict[str, Any]]) -> None:
    """The constructed kinds' decisions counted by the size their amount made at each
    decision's own baseline speed (benchmarks/ab_by_size.py): a machine's speed drifts
    from the one its amounts were sized at."""
    for kind in sorted(CONSTRUCTED):
        metric = SLOWDOWN_BY_NAME[kind].moves
        decisions = [e for e in entries if e["case"] == "decision" and e["kind"] == kind]
        # Kept apart per prompt settings and sampling, as the cells are.
        for prompts in sorted({_prompt(e) for e in decisions}):
            print_by_size([e for e in decisions if _prompt(e) == prompts], metric,
                          partial(_verdict_today, metric=metric),
                          f"{kind} (prompts {prompts})")


def _verdict_today(decision: dict[str, Any], metric: str) -> str:
    return _judged_today(decision)[metric]


def report(entries: list[dict[str, Any]]) -> None:
    """The markdown table of the whole log: one row per kind, level and design."""
    cells = _cells(entries)
    print("\n| kind | level | amount | true (solo, 95 %) | true (constructed, 95 %) | "
          "design | decisions | regressed (95 %) | unchanged | unknown | measured / true | "
          "attributed to | decision (median) | extended past the budget |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- "
          "| --- |")
    for cell in cells:
        done = _decisions(entries, cell)
        amount = done[0]["amount"]
        # Judged again with today's rule: a log made before a rule change reads as the
        # rule now decides those pairs (each decision's pairs end where it stopped).
        judged = [_judged_today(e) for e in done]
        verdicts = Counter(found[cell.metric] for found in judged)
        pairs = [tuple(p) for e in done for p in e["pairs"].get(cell.metric, [])]
        measured = _median_effect(pairs, cell.metric)
        if _is_aa(cell.kind):
            truth_text, constructed_text, ratio_text = "0", "0", "—"
        else:
            truth = _median_effect(_solo_pairs(entries, cell, amount), cell.metric)
            truth_text, constructed_text = _truths(entries, cell, amount)
            ratio_text = (f"{measured / truth:.2f}" if truth and measured is not None
                          and truth > 0 else "—")
        attributed = Counter(metric for found in judged for metric, verdict in
                             found.items() if verdict == AbVerdict.REGRESSED.value)
        attributed_text = ", ".join(f"{m} {n}/{len(done)}" for m, n in
                                    attributed.most_common()) or "none"
        kind = _kind_label(cell)
        chosen = sorted({e["ttft_prompt"] for e in done if e.get("ttft_prompt")})
        if chosen and cell.prompts.endswith("/auto"):
            kind += f" (first token on {', '.join(map(str, chosen))})"
        print(f"| {kind} | {cell.level:.0%} | {amount} | {truth_text} | "
              f"{constructed_text} | {cell.design} | "
              f"{len(done)} | {rate_text(verdicts['regressed'], len(done))} | "
              f"{verdicts['unchanged']} | {verdicts['unknown']} | {ratio_text} | "
              f"{attributed_text} | "
              f"{median_time_text(done)} | {_extensions(done)} |")
    for cell in cells:
        if cell.kind in CONSTRUCTED:
            done = _decisions(entries, cell)
            amount = done[0]["amount"]
            extra = _us_text(_extra_token_us(_solo_pairs(entries, cell, amount)))
            # The design's own pairs: many more than the solo ones, so a narrow interval,
            # but measured by the design under test (a check of the construction only).
            by_design = _us_text(_extra_token_us(
                tuple(p) for e in done for p in e["pairs"].get(cell.metric, [])))
            print(f"\n{cell.kind} {cell.level:.0%}: the wait is {amount} µs a token; the solo "
                  f"pairs measured {extra} a token (the constructed truth holds where "
                  f"these agree); the {cell.design} decisions' pairs {by_design}.")
    for cell in cells:
        if _is_aa(cell.kind):
            done = _decisions(entries, cell)
            higher = _higher_is_better(cell.metric)
            effects = [effect(c / b, higher) for e in done
                       for b, c in e["pairs"].get(cell.metric, [])]
            print(f"\n{cell.kind} {cell.design}: the pairs' median effect "
                  f"{_interval_text(effects)} (a change of the "
                  "candidate's own, not the design's: a plain A/A's is about 0).")
            print(f"\n{_replayed(done, cell)}")
    _by_size(entries)
    for failure in (e for e in entries if e["case"] == "failure"):
        print(f"\nFAILED: {failure['kind']} {failure['level']:.0%} {failure['design']} "
              f"(prompts {_prompt(failure)}): {failure['error'].splitlines()[0]}")
    print(f"\nTargets: regressed >= {TARGET_DETECTION[0.10]:.0%} at a true 10 %, >= "
          f"{TARGET_DETECTION[0.05]:.0%} at 5 %; A/A regressed <= {TARGET_FALSE_ALARMS:.0%};"
          f" median decision <= {TARGET_DECISION_S:.0f} s. 'measured / true': the design's "
          "median pair effect over the solo one.")


def _replayed(done: list[dict[str, Any]], cell: Cell) -> str:
    """A/A decisions replayed from the cell's recorded pairs: each redraws pairs (with
    their covariate values) up to as many as the budget and its extension hold and is
    judged block by block as the gate judges; its "regressed" is a false alarm. Many
    more decisions than can be measured bound the rate far tighter, at the price of
    independent draws: a real run's drift from pair to pair is not redrawn."""
    metric = cell.metric
    pooled = [(float(b), float(c)) for e in done for b, c in e["pairs"].get(metric, [])]
    owns = [_entry_covariates(e).get(metric) or [] for e in done]
    widths = {len(own) for own in owns}
    # Adjusted only where every decision was adjusted alike; else the raw pairs.
    columns = ([[value for own in owns for value in own[k]] for k in range(widths.pop())]
               if len(widths) == 1 else [])
    rule = AbRule()
    timed = [e["elapsed_s"] / len(e["pairs"][metric]) for e in done if e["pairs"].get(metric)]
    if len(pooled) < rule.min_pairs or not timed:
        return f"{cell.kind} {cell.design}, replayed: too few pairs"
    # As many pairs as the budget and its extension hold at the cell's pace: a real A/A
    # decision that stays unknown goes on that long, and every look is a chance to alarm.
    # The run's own budget and extension where its log records them (older logs: the
    # defaults, which those runs used).
    seconds = statistics.median(timed)
    allowed = statistics.median(
        e.get("budget_s", rule.budget_s) + e.get("extend_s", AB_EXTEND_S) for e in done)
    horizon = max(rule.min_pairs, int(allowed / seconds))
    rate = resampled_false_alarm_rate(
        pooled, rule, METRICS[metric].direction, trials=REPLAY_TRIALS,
        pairs_per_decision=horizon, seed=0, sequential=True,
        min_change=METRICS[metric].min_change, covariates=columns or None)
    alarms = round(rate * REPLAY_TRIALS)
    low, high = wilson_interval(alarms, REPLAY_TRIALS)
    adjusted = "each with its covariate" if columns else "raw"
    return (f"{cell.kind} {cell.design}, replayed: {REPLAY_TRIALS} decisions of up to "
            f"{horizon} pairs (the budget and its extension at {seconds:.1f} s a pair), "
            f"redrawn from the {len(pooled)} recorded A/A pairs ({adjusted}) and judged "
            f"block by block: regressed {alarms}/{REPLAY_TRIALS} ({low:.1%} to {high:.1%}); "
            "independent draws: a real run's drift is not redrawn.")


def _extensions(done: list[dict[str, Any]]) -> str:
    """How many decisions measured past the budget, and the median seconds they added."""
    extended = [e["extended_s"] for e in done if e.get("extended_s")]
    if not extended:
        return f"0/{len(done)}"
    return f"{len(extended)}/{len(done)}, median +{statistics.median(extended):.0f} s"


def _counts(text: str) -> dict[str, int]:
    counts = dict(DEFAULT_DECISIONS)
    for item in filter(None, text.split(",")):
        design, _, number = item.partition("=")
        if design not in DESIGNS:
            raise SystemExit(f"--decisions: {design!r} is not one of {', '.join(DESIGNS)}")
        counts[design] = int(number)
    return counts


def _wanted(args: argparse.Namespace, kinds: list[str], designs: list[str],
            prompts: str) -> dict[Cell, int]:
    """Each cell the run measures, in round-robin order, and its decisions wanted."""
    counts = _counts(args.decisions)
    wanted = {Cell(kind, float(level), design, prompts): counts[design]
              for level in args.levels.split(",") for kind in kinds for design in designs}
    for kind, count in (("aa", args.aa), (AA_NEIGHBOUR, args.aa_neighbour),
                        (AA_PATCHED, args.aa_patched)):
        if count:
            wanted.update({Cell(kind, 0.0, design, prompts): count for design in designs})
    return wanted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="all",
                        help=f"comma-separated, of {', '.join(k.name for k in SLOWDOWNS)}")
    parser.add_argument("--levels", default="0.10")
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--decisions", default="", metavar="DESIGN=N,...",
                        help=f"decisions per cell by design (default {DEFAULT_DECISIONS})")
    parser.add_argument("--aa", type=int, default=0, help="A/A decisions per design")
    parser.add_argument("--aa-patched", type=int, default=0,
                        help="A/A decisions per design with the slowed build, every "
                        "slowdown unset, as the candidate: the patch's own cost")
    parser.add_argument("--aa-neighbour", type=int, default=0,
                        help="A/A decisions per design beside a noisy neighbour (a build "
                        "of the pinned tree on the same cores)")
    parser.add_argument("--n-prompt", type=int, default=DEFAULT_PROMPT_TOKENS,
                        help="prompt tokens of the timed completions")
    parser.add_argument("--ttft-prompt", default="auto",
                        help="prompt tokens of the first-token requests, or auto")
    parser.add_argument("--log", type=Path, action="append",
                        help="the JSONL log (default ab-detection.jsonl); with "
                        "--report-only it may be given once per machine, and the cells "
                        "are also pooled over the logs")
    parser.add_argument("--budget-s", type=float, default=AbRule().budget_s)
    parser.add_argument("--extend-s", type=float, default=AB_EXTEND_S,
                        help="seconds past the budget while a shown change straddles the "
                        "threshold (harness ab's default)")
    parser.add_argument("--deadline-s", type=float, default=math.inf,
                        help="start no decision after this many seconds")
    parser.add_argument("--sampling", choices=sorted(SAMPLINGS), default=GATE_SAMPLING,
                        help="harness ab's sampling defaults (gate), or the plain "
                        "measurement earlier logs used")
    parser.add_argument("--truth-s", type=float, default=0.0,
                        help="seconds of one more solo comparison per kind and level at "
                        "its sized amount (once per log), so the true size's interval is "
                        "narrower than the size")
    parser.add_argument("--report-only", action="store_true")
    args = parser.parse_args()
    kinds = ([k.name for k in SLOWDOWNS] if args.kinds == "all"
             else [k for k in args.kinds.split(",") if k])
    unknown = sorted(set(kinds) - set(SLOWDOWN_BY_NAME))
    if unknown:
        raise SystemExit(f"--kinds: unknown {', '.join(unknown)}")
    designs = [d for d in args.designs.split(",") if d]
    logs: list[Path] = args.log or [DEFAULT_LOG]
    if args.report_only:
        read = {str(log): _entries(log) for log in logs}
        for name, entries in read.items():
            if len(read) > 1:
                print(f"\n### {name}")
            report(entries)
        if len(read) > 1:
            pooled_report(read)
        return
    if len(logs) > 1:
        raise SystemExit("--log: a run appends to one log; give several with --report-only")
    ttft_prompt = None if args.ttft_prompt == "auto" else int(args.ttft_prompt)
    bench = Bench(logs[0], AbRule(budget_s=args.budget_s, extend_s=args.extend_s),
                  args.n_prompt, ttft_prompt, args.sampling)
    wanted = _wanted(args, kinds, designs, bench.prompts)
    cells = list(wanted)
    if args.truth_s:
        for kind in kinds:
            for level in args.levels.split(","):
                bench.solo(kind, float(level), args.truth_s)
    started = time.monotonic()
    # Round robin, so a run stopped early has figures for every cell.
    while time.monotonic() - started < args.deadline_s:
        pending = [c for c in cells if len(_decisions(bench.entries, c))
                   + len(_decisions(bench.entries, c, "failure")) < wanted[c]]
        if not pending:
            break
        for cell in pending:
            if time.monotonic() - started >= args.deadline_s:
                break
            bench.decide(cell)
    report(bench.entries)


if __name__ == "__main__":
    main()
