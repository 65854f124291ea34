"""Where to probe next, and what the probes so far prove (pure).

The history is a list of commits, oldest first (parents before children): the good
endpoint, every commit after it that leads to the bad endpoint, the bad endpoint last.
Without a parent map it is a line, each commit the child of the one before; with one
(a git range searched without ``--first-parent``, merged side branches included) it is
the graph ``git bisect`` searches. Either way a commit judged good makes its ancestors
good, and a commit judged bad holds the first bad commit among its ancestors (itself
included): the first bad commit is an ancestor of the oldest bad commit that is no
ancestor of a good one. Commits in there that could not be judged (their build failed,
the oracle said "skip", or a measurement matched neither side) stay candidates: when
only those remain, the answer is the candidate set, not a guess.

The next probe is the unjudged candidate whose ancestors among the candidates come
nearest half of them (the oldest on a tie): on a line, the commit nearest the middle of
the open range; on a graph, git bisect's choice. A good commit that descends from the
oldest bad one contradicts it (a flaky oracle, or a fix and a new break) and is set
aside, as a good probed after a bad on a line always was.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias


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


#: Each commit's parents (shas); None: a line, each commit the child of the one before.
Parents: TypeAlias = Mapping[str, Sequence[str]] | None


@dataclass(frozen=True)
class Window:
    """What the probes prove: the first bad commit is one of ``possible`` (indices)."""

    #: Index of the oldest bad commit: every other bad one descends from it.
    high: int
    #: Indices of every commit that may still be the first bad one, oldest first:
    #: ``high``'s ancestors that are no good commit's ancestors, ``high`` included.
    possible: tuple[int, ...]
    #: Indices among ``possible`` that no probe has judged yet.
    unjudged: tuple[int, ...]
    #: Indices among ``possible`` that were skipped or left undecided.
    skipped: tuple[int, ...]

    @property
    def settled(self) -> bool:
        """Nothing left worth probing: the culprit, or only skipped candidates."""
        return not self.unjudged

    @property
    def candidates(self) -> tuple[int, ...]:
        """Every index that may be the first bad commit, oldest first."""
        return self.possible

    @property
    def culprit(self) -> int | None:
        """The first bad commit's index, once nothing else is possible."""
        return self.high if self.settled and not self.skipped else None


def ancestry(history: Sequence[str], parents: Parents = None) -> list[int]:
    """Each commit's ancestors in ``history``, itself included, as a bit set of indices."""
    if parents is None:
        return [(2 << i) - 1 for i in range(len(history))]
    index = {sha: i for i, sha in enumerate(history)}
    reach: list[int] = []
    for i, sha in enumerate(history):
        bits = 1 << i
        for parent in parents.get(sha, ()):
            at = index.get(parent)
            if at is not None and at < i:  # oldest first: a parent is listed before
                bits |= reach[at]
        reach.append(bits)
    return reach


def _indices(bits: int) -> tuple[int, ...]:
    return tuple(i for i in range(bits.bit_length()) if bits >> i & 1)


def window(history: Sequence[str], verdicts: Mapping[str, Verdict],
           parents: Parents = None) -> Window:
    """What ``verdicts`` prove about ``history`` (whose ends must be judged good and bad)."""
    return _window(history, verdicts, ancestry(history, parents))


def _window(history: Sequence[str], verdicts: Mapping[str, Verdict],
            reach: Sequence[int]) -> Window:
    if len(history) < 2:
        raise ValueError("a bisect needs a good and a bad commit")
    if verdicts.get(history[0]) is not Verdict.GOOD or \
            verdicts.get(history[-1]) is not Verdict.BAD:
        raise ValueError("the endpoints must be judged good and bad before the search")
    judged = [verdicts.get(sha) for sha in history]
    bad = [i for i, said in enumerate(judged) if said is Verdict.BAD]
    # The bad commit with the fewest ancestors: on a line the oldest; on a graph every
    # bad commit a search probes descends from it.
    high = min(bad, key=lambda i: (reach[i].bit_count(), i))
    cleared = 0
    for i, said in enumerate(judged):
        if said is Verdict.GOOD and not reach[i] >> high & 1:
            cleared |= reach[i]
    possible = _indices(reach[high] & ~cleared)
    return Window(
        high=high, possible=possible,
        unjudged=tuple(i for i in possible if judged[i] is None),
        skipped=tuple(i for i in possible if judged[i] in UNJUDGED))


def next_probe(history: Sequence[str], verdicts: Mapping[str, Verdict],
               parents: Parents = None) -> str | None:
    """The commit to judge next, or None when the window is settled."""
    reach = ancestry(history, parents)
    found = _window(history, verdicts, reach)
    if found.settled:
        return None
    possible = sum(1 << i for i in found.possible)
    total = len(found.possible)

    def split(i: int) -> int:
        below = (reach[i] & possible).bit_count()
        return min(below, total - below)

    return history[min(found.unjudged, key=lambda i: (-split(i), i))]


def probes_left(found: Window) -> int:
    """How many more probes the search needs if none is skipped (for progress lines):
    ceil(log2(n + 1)) for n unjudged candidates."""
    return len(found.unjudged).bit_length()
