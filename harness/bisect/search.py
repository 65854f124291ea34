"""Where to probe next, and what the probes so far prove (pure).

The history is a list of commits, oldest first: the good endpoint, every commit after
it up to the bad endpoint, the bad endpoint last. The first bad commit lies after the
newest good commit that comes before the oldest bad one, and at or before that bad one.
Commits in between that could not be judged (their build failed, the oracle said
"skip", or a measurement matched neither side) stay candidates: when only those
remain, the answer is the candidate range, not a guess.

The next probe is the unjudged commit nearest the middle of the open range (the lower
one on a tie), as ``git bisect`` picks one near the middle when the middle is skipped.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


class Verdict(enum.Enum):
    GOOD = "good"
    BAD = "bad"
    #: Could not be judged: the build failed, or the oracle said so (exit 125).
    SKIP = "skip"
    #: Measured, but matched neither endpoint within its budget (the metric oracle):
    #: a candidate like a skipped commit, never guessed to one side.
    UNDECIDED = "undecided"


#: Verdicts that do not move the window.
UNJUDGED = frozenset({Verdict.SKIP, Verdict.UNDECIDED})


@dataclass(frozen=True)
class Window:
    """What the probes prove: the first bad commit is in ``history[low + 1 : high + 1]``."""

    #: Index of the newest good commit before ``high``.
    low: int
    #: Index of the oldest bad commit.
    high: int
    #: Indices strictly between the two that no probe has judged yet.
    unjudged: tuple[int, ...]
    #: Indices strictly between the two that were skipped or left undecided.
    skipped: tuple[int, ...]

    @property
    def settled(self) -> bool:
        """Nothing left worth probing: the culprit, or only skipped candidates."""
        return not self.unjudged

    @property
    def candidates(self) -> tuple[int, ...]:
        """Every index that may be the first bad commit, oldest first."""
        return (*self.skipped, self.high) if self.settled else \
            tuple(range(self.low + 1, self.high + 1))

    @property
    def culprit(self) -> int | None:
        """The first bad commit's index, once nothing else is possible."""
        return self.high if self.settled and not self.skipped else None


def window(history: Sequence[str], verdicts: Mapping[str, Verdict]) -> Window:
    """What ``verdicts`` prove about ``history`` (whose ends must be judged good and bad)."""
    if len(history) < 2:
        raise ValueError("a bisect needs a good and a bad commit")
    if verdicts.get(history[0]) is not Verdict.GOOD or \
            verdicts.get(history[-1]) is not Verdict.BAD:
        raise ValueError("the endpoints must be judged good and bad before the search")
    high = next(i for i, commit in enumerate(history) if verdicts.get(commit) is Verdict.BAD)
    low = max(i for i in range(high) if verdicts.get(history[i]) is Verdict.GOOD)
    between = range(low + 1, high)
    return Window(
        low=low, high=high,
        unjudged=tuple(i for i in between if history[i] not in verdicts),
        skipped=tuple(i for i in between if verdicts.get(history[i]) in UNJUDGED))


def next_probe(history: Sequence[str], verdicts: Mapping[str, Verdict]) -> str | None:
    """The commit to judge next, or None when the window is settled."""
    found = window(history, verdicts)
    if found.settled:
        return None
    middle = (found.low + found.high) / 2
    return history[min(found.unjudged, key=lambda i: (abs(i - middle), i))]


def probes_left(history: Sequence[str], verdicts: Mapping[str, Verdict]) -> int:
    """How many more probes the search needs if none is skipped (for progress lines):
    ceil(log2(n + 1)) for n unjudged commits in the window."""
    return len(window(history, verdicts).unjudged).bit_length()
