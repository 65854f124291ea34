"""The order an A/B comparison starts its servers in, and the pairs it reads back (pure).

Three designs, each pairing a baseline sample with a candidate sample taken in the
same minute, so drift of the machine (thermal state, other load, the page cache)
cancels in the pair's ratio instead of landing on one arm:

- ``sequential``: the solo measurement, and the ground truth the others are validated
  against. A pair's two starts run one after the other, in an order a coin flips, each
  alone on the machine and pinned to the same half of the cores with the same threads
  (the half a coin picks per pair). No arm ever shares the hardware with the other, so
  nothing of one arm's load lands in the other's figures.
- ``interleaved``: blocks of four fresh starts, ABBA or BAAB at random, one after the
  other with every core. Pairs are the block's first two and last two starts. ABBA
  cancels a linear drift within the block; the coin flip keeps a periodic one from
  lining up with an arm.
- ``duet``: both arms at once, each pinned to its own half of the cores (Bulej et al.,
  "Duet benchmarking", ICPE 2020), which arm gets which half decided by a coin flip per
  pair. Both arms see the same moment of the machine; each sees half of it — and
  whatever the halves share (caches, memory bandwidth, one GPU), which can compress a
  real change: a duet verdict is trusted only where a calibration on the runner showed
  it keeps effect sizes (harness/ab/validation.py).
- ``alternating``: both arms' servers started together on the same half of the cores
  (a coin picks it), their timed requests alternating one by one, ABBA..., the first
  arm by a coin flip; only one server works at a time. Where the machine's speed moves
  from second to second (a 2-core VM: 8-14 % between a sequential pair's two starts),
  each completion of one arm has one of the other within a fraction of a second. The
  idle server's memory stays resident beside the working one, and their model loads
  share the half: trusted, like duet, only where a calibration showed it keeps effect
  sizes.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from harness.numerics.fingerprint import Fingerprint

BASELINE = "baseline"
CANDIDATE = "candidate"
SEQUENTIAL = "sequential"
INTERLEAVED = "interleaved"
DUET = "duet"
ALTERNATING = "alternating"
DESIGNS = (SEQUENTIAL, INTERLEAVED, DUET, ALTERNATING)
#: The designs that pin each start to half of the cores (and so need host processes).
HALVED = (SEQUENTIAL, DUET, ALTERNATING)

_ORDERS = {"ABBA": (BASELINE, CANDIDATE, CANDIDATE, BASELINE),
           "BAAB": (CANDIDATE, BASELINE, BASELINE, CANDIDATE)}


@dataclass(frozen=True)
class Slot:
    """One server start of a block: which arm, and (duet) which half of the cores."""

    arm: str
    #: Index of the pair the sample belongs to (within the whole comparison).
    pair: int
    #: Duet only: 0 or 1, the half of the cores the arm is pinned to.
    half: int | None = None


@dataclass(frozen=True)
class Block:
    number: int
    #: Each quartet's ``ABBA``/``BAAB`` (interleaved) or each pair's ``AB``/``BA`` (duet:
    #: the arm on half 0 first), joined by ``+`` in the order they run.
    order: str
    #: Started one after the other, or (duet) a pair's two slots together.
    slots: tuple[Slot, ...]
    #: Duet: a pair's two starts run at once, on opposite halves.
    together: bool = False
    #: Alternating: a pair's two servers run at once on one half, measured in turns
    #: (the slot first in the block, first in each turn).
    coresident: bool = False


def plan_block(design: str, number: int, rng: random.Random, starts: int = 4) -> Block:
    """Block ``number`` (from 0) of ``design``: ``starts`` server starts between two looks.

    Interleaved: ``starts // 4`` quartets, each ABBA or BAAB by its own coin flip.
    Duet: ``starts // 2`` pairs run one after the other, each pair's arms at once on
    halves picked by a coin flip per pair. Sequential: ``starts // 2`` pairs, each
    pair's arms one after the other in a flipped order, both on one flipped half;
    alternating the same, the order being whose request goes first in each turn. Its
    randomness comes from ``rng`` only.
    """
    if design == INTERLEAVED:
        if starts < 4 or starts % 4:
            raise ValueError(f"an interleaved block is whole ABBA/BAAB quartets: {starts} "
                             "starts is not a positive multiple of 4")
        quartets = starts // 4
        orders, slots = [], []
        for offset in range(quartets):
            order = rng.choice(sorted(_ORDERS))
            orders.append(order)
            quartet = number * quartets + offset
            first, second = 2 * quartet, 2 * quartet + 1
            slots += [Slot(arm, first if i < 2 else second)
                      for i, arm in enumerate(_ORDERS[order])]
        return Block(number, "+".join(orders), tuple(slots))
    if design in HALVED:
        if starts < 2 or starts % 2:
            raise ValueError(f"a {design} block is whole pairs: {starts} starts is not a "
                             "positive multiple of 2")
        pairs = starts // 2
        orders, slots = [], []
        for offset in range(pairs):
            pair = number * pairs + offset
            if design == DUET:
                baseline_half = rng.randrange(2)
                orders.append("AB" if baseline_half == 0 else "BA")
                slots += [Slot(BASELINE, pair, baseline_half),
                          Slot(CANDIDATE, pair, 1 - baseline_half)]
                continue
            # Sequential, alternating: first the order, then the half both starts of the
            # pair share.
            order = rng.choice(("AB", "BA"))
            half = rng.randrange(2)
            orders.append(order)
            arms = (BASELINE, CANDIDATE) if order == "AB" else (CANDIDATE, BASELINE)
            slots += [Slot(arm, pair, half) for arm in arms]
        return Block(number, "+".join(orders), tuple(slots), together=design == DUET,
                     coresident=design == ALTERNATING)
    raise ValueError(f"unknown A/B design {design!r}; one of {', '.join(DESIGNS)}")


@dataclass(frozen=True)
class Sample:
    """What one server start measured, and where it stood in the comparison."""

    arm: str
    pair: int
    block: int
    #: Its place in the order of starts (duet: both of a pair share a block, not this).
    sequence: int
    #: Seconds since the comparison began, when the start began.
    at_s: float
    values: dict[str, float]
    counters: dict[str, str]
    half: int | None = None
    #: The greedy completion's tokens and top log-probabilities
    #: (``harness.numerics.fingerprint``): what the build computed, compared by the
    #: numerics verdict.
    fingerprint: Fingerprint | None = None
    #: The machine's speed on the server's cores around its timed completions
    #: (harness/ab/machine_speed.py; None: not read).
    machine: float | None = None


def paired_values(samples: Sequence[Sample], metric: str) -> tuple[list[float], list[float]]:
    """(baseline, candidate) values of ``metric``, one entry per complete pair, in order.

    A pair where either start lacks the metric (the server did not report it) is left
    out whole, so the two lists always line up.
    """
    by_pair: dict[int, dict[str, float]] = {}
    for sample in samples:
        if metric in sample.values:
            by_pair.setdefault(sample.pair, {})[sample.arm] = sample.values[metric]
    baseline, candidate = [], []
    for pair in sorted(by_pair):
        arms = by_pair[pair]
        if BASELINE in arms and CANDIDATE in arms:
            baseline.append(arms[BASELINE])
            candidate.append(arms[CANDIDATE])
    return baseline, candidate
