"""The pure bisection: where to probe next and what the probes prove."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.bisect.search import Verdict, next_probe, probes_left, window

G, B, S = Verdict.GOOD, Verdict.BAD, Verdict.SKIP
HISTORY = [f"c{i}" for i in range(9)]  # c0 good ... c8 bad


def _verdicts(**said: Verdict) -> dict[str, Verdict]:
    return {"c0": G, "c8": B, **said}


def test_the_first_probe_is_the_middle_and_the_window_narrows() -> None:
    assert next_probe(HISTORY, _verdicts()) == "c4"
    assert next_probe(HISTORY, _verdicts(c4=B)) == "c2"
    assert next_probe(HISTORY, _verdicts(c4=B, c2=G)) == "c3"
    found = window(HISTORY, _verdicts(c4=B, c2=G, c3=G))
    assert (found.low, found.high, found.culprit) == (3, 4, 4)
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
    assert found.low == 0


def test_the_endpoints_must_be_judged_first() -> None:
    with pytest.raises(ValueError, match="endpoints"):
        window(HISTORY, {"c0": G})
    with pytest.raises(ValueError, match="endpoints"):
        window(HISTORY, {"c0": B, "c8": B})


def test_probes_left_is_the_log_of_what_is_unjudged() -> None:
    assert probes_left(HISTORY, _verdicts()) == 3  # 7 unjudged
    assert probes_left(HISTORY, _verdicts(c4=B, c2=G)) == 1
    assert probes_left(HISTORY, _verdicts(c4=B, c2=G, c3=G)) == 0


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
