"""The pure bisection: where to probe next and what the probes prove."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.bisect.search import Verdict, ancestry, next_probe, probes_left, window

G, B, S = Verdict.GOOD, Verdict.BAD, Verdict.SKIP
HISTORY = [f"c{i}" for i in range(9)]  # c0 good ... c8 bad


def _verdicts(**said: Verdict) -> dict[str, Verdict]:
    return {"c0": G, "c8": B, **said}


def test_the_first_probe_is_the_middle_and_the_window_narrows() -> None:
    assert next_probe(HISTORY, _verdicts()) == "c4"
    assert next_probe(HISTORY, _verdicts(c4=B)) == "c2"
    assert next_probe(HISTORY, _verdicts(c4=B, c2=G)) == "c3"
    found = window(HISTORY, _verdicts(c4=B, c2=G, c3=G))
    assert (found.possible, found.high, found.culprit) == ((4,), 4, 4)
    assert next_probe(HISTORY, _verdicts(c4=B, c2=G, c3=G)) is None


def test_a_skipped_middle_moves_the_probe_to_its_nearest_neighbour() -> None:
    assert next_probe(HISTORY, _verdicts(c4=S)) == "c3"
    assert next_probe(HISTORY, _verdicts(c4=S, c3=G)) == "c5"  # nearest to 5.5, lower on a tie


def test_only_skipped_commits_left_gives_the_candidates_not_a_guess() -> None:
    found = window(HISTORY, _verdicts(c2=G, c3=S, c4=S, c5=B))
    assert found.settled
    assert found.culprit is None
    assert found.candidates == (3, 4, 5)


def test_a_good_after_a_bad_does_not_move_the_window_past_the_first_bad() -> None:
    found = window(HISTORY, _verdicts(c3=B, c6=G))
    assert found.high == 3
    assert found.possible == (1, 2, 3)


def test_the_endpoints_must_be_judged_first() -> None:
    with pytest.raises(ValueError, match="endpoints"):
        window(HISTORY, {"c0": G})
    with pytest.raises(ValueError, match="endpoints"):
        window(HISTORY, {"c0": B, "c8": B})


def test_probes_left_is_the_log_of_what_is_unjudged() -> None:
    assert probes_left(window(HISTORY, _verdicts())) == 3  # 7 unjudged
    assert probes_left(window(HISTORY, _verdicts(c4=B, c2=G))) == 1
    assert probes_left(window(HISTORY, _verdicts(c4=B, c2=G, c3=G))) == 0


@given(size=st.integers(min_value=2, max_value=200), data=st.data())
def test_probing_any_monotone_history_finds_its_first_bad_commit(size: int,
                                                                 data: st.DataObject) -> None:
    first_bad = data.draw(st.integers(min_value=1, max_value=size - 1))
    skipped = data.draw(st.sets(st.integers(min_value=1, max_value=size - 2))) \
        if size > 2 else set()
    history = [f"c{i}" for i in range(size)]
    truth = {c: (S if i in skipped else G if i < first_bad else B)
             for i, c in enumerate(history)}
    verdicts = {history[0]: G, history[-1]: B}
    probes = 0
    while (commit := next_probe(history, verdicts)) is not None:
        verdicts[commit] = truth[commit]
        probes += 1
        assert probes <= size
    found = window(history, verdicts)
    assert first_bad in found.candidates
    if first_bad not in skipped and first_bad - 1 not in skipped:
        assert found.culprit == first_bad
    if not skipped:
        assert probes <= (size - 2).bit_length()


# A side branch merged into the main line, listed the way `git log --reverse --topo-order`
# lists it: the side branch's commits before the main line's own.
MERGED = ["c0", "s1", "s2", "m1", "merge", "m2", "m3"]
MERGED_PARENTS = {"s1": ["c0"], "s2": ["s1"], "m1": ["c0"], "merge": ["m1", "s2"],
                  "m2": ["merge"], "m3": ["m2"]}


def _search(history: list[str], truth: dict[str, Verdict],
            parents: dict[str, list[str]] | None) -> tuple[int | None, int]:
    verdicts = {history[0]: G, history[-1]: B}
    probes = 0
    while (commit := next_probe(history, verdicts, parents)) is not None:
        verdicts[commit] = truth[commit]
        probes += 1
        assert probes <= len(history)
    return window(history, verdicts, parents).culprit, probes


def test_a_merged_side_branch_is_searched_as_a_graph() -> None:
    # s1 breaks it: the side branch, the merge and what follows are bad; m1 never had s1.
    truth = {"c0": G, "s1": B, "s2": B, "m1": G, "merge": B, "m2": B, "m3": B}
    culprit, _ = _search(MERGED, truth, MERGED_PARENTS)
    assert MERGED[culprit or 0] == "s1"
    # Read as a line, m1 good would clear s1 and s2 listed before it and blame the merge.
    line_culprit, _ = _search(MERGED, truth, None)
    assert MERGED[line_culprit or 0] == "merge"


def test_a_good_commit_clears_only_its_own_ancestors() -> None:
    found = window(MERGED, {"c0": G, "m1": G, "m3": B}, MERGED_PARENTS)
    assert [MERGED[i] for i in found.possible] == ["s1", "s2", "merge", "m2", "m3"]


@given(size=st.integers(min_value=2, max_value=60), data=st.data())
def test_probing_any_merged_history_finds_its_first_bad_commit(size: int,
                                                               data: st.DataObject) -> None:
    history = [f"c{i}" for i in range(size)]
    parents: dict[str, list[str]] = {}
    children: set[int] = set()
    for i in range(1, size - 1):
        chosen = data.draw(st.sets(st.integers(min_value=0, max_value=i - 1),
                                   min_size=1, max_size=2))
        parents[history[i]] = [history[p] for p in sorted(chosen)]
        children |= chosen
    # The bad endpoint merges every branch tip, so every commit leads to it.
    tips = [i for i in range(size - 1) if i not in children]
    parents[history[-1]] = [history[i] for i in tips]
    first_bad = data.draw(st.integers(min_value=1, max_value=size - 1))
    reach = ancestry(history, parents)
    truth = {c: B if reach[i] >> first_bad & 1 else G for i, c in enumerate(history)}
    culprit, _ = _search(history, truth, parents)
    assert culprit == first_bad
