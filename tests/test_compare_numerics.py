"""A run's numerics fingerprints in its record, through the schema and the store, and
``harness compare`` holding them to the baseline's: changed numbers fail the comparison.

The fingerprints here are made up (they test the comparison's control flow and the
record's validation); tests/test_numerics_catches.py records real ones from servers.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import numpy as np
import pytest
import results_fixtures
from results_fixtures import BUILD, at, make_run

from harness.numerics.fingerprint import (
    KLD_FLOOR,
    RECORD_TOP_N,
    Fingerprint,
    fingerprint_from_json,
    record_fingerprint_of,
)
from harness.numerics.probabilities import ReportedDistributions
from harness.results.comparison import compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.run_record import RunRecord
from harness.results.run_validation import RunRecordError, run_from_json
from harness.results.store import ResultsStore

store_url = results_fixtures.store_url
store = results_fixtures.store

PROBE = "suites/test_numerics.py::test_distributions_match_the_reference[bench-f16]"


def _print(shift: float = 0.0, tokens: tuple[int, ...] = (3, 1, 2)) -> dict[str, Any]:
    """Three positions over five tokens; ``shift`` moves probability from the top token."""
    rows = []
    for top in tokens:
        p = np.full(5, 0.1)
        p[top] = 0.6
        p[top] -= shift
        p[(top + 1) % 5] += shift
        rows.append(tuple((t, float(math.log(p[t]))) for t in range(5)))
    return Fingerprint(tokens, tuple(rows)).as_json()


def _run(run_id: str, numerics: dict[str, dict[str, Any]] | None, *, when: int = 0,
         build_key: str = BUILD.build_key) -> RunRecord:
    build = dataclasses.replace(BUILD, build_key=build_key)
    return dataclasses.replace(make_run(run_id, started_at=at(when), build=build),
                               numerics=numerics)


def test_the_same_numbers_pass_and_changed_numbers_fail_the_comparison() -> None:
    base = [_run("base", {PROBE: _print()}, when=1)]
    same = compare(base, _run("now", {PROBE: _print()}, when=2))
    assert [p.comparison.verdict.value for p in same.numerics] == ["unchanged"]
    assert not same.regressed
    changed = compare(base, _run("now", {PROBE: _print(shift=0.01)}, when=2))
    assert [p.test_id for p in changed.numerics_changes] == [PROBE]
    assert changed.regressed
    text = comparison_markdown(changed)
    assert "numbers changed in 1 numerics probe" in text.splitlines()[0]
    assert PROBE in text
    assert "exceeds" in text
    body = comparison_json(changed)
    assert body["regressed"]
    assert body["numerics"][0]["verdict"] == "changed"
    assert body["numerics_counts"] == {"unchanged": 0, "changed": 1, "not measured": 0}


def test_a_change_under_the_kl_floor_is_no_change() -> None:
    # 1e-4 of probability moved: a KL divergence near 1e-8, far under the floor.
    result = compare([_run("base", {PROBE: _print()})], _run("now", {PROBE: _print(1e-4)}))
    change = result.numerics[0].comparison.change
    assert change is not None
    assert 0 < change.max_kld < KLD_FLOOR
    assert not result.regressed


def test_the_band_comes_from_baseline_runs_of_the_anchor_build_only() -> None:
    # Two runs of the anchor's build 0.002 apart make a band; an older run of another
    # build far off does not widen it.
    base = [_run("b2", {PROBE: _print(0.002)}, when=3), _run("b1", {PROBE: _print()}, when=2),
            _run("old", {PROBE: _print(0.2)}, when=1, build_key="another-build")]
    within = compare(base, _run("now", {PROBE: _print(0.004)}, when=4))
    assert not within.regressed, within.numerics
    assert within.numerics[0].comparison.band_kld > KLD_FLOOR / 10
    beyond = compare(base, _run("now", {PROBE: _print(0.05)}, when=4))
    assert beyond.regressed


def test_a_probe_missing_from_the_baseline_is_reported_not_judged() -> None:
    result = compare([_run("base", {})], _run("now", {PROBE: _print(0.3)}))
    assert [p.comparison.verdict.value for p in result.numerics] == ["not measured"]
    assert "no fingerprint of this probe" in result.numerics[0].comparison.reason
    assert not result.regressed
    assert "1 not measured" in comparison_markdown(result)


def test_an_ab_result_whose_numbers_changed_fails_the_comparison() -> None:
    ab = {"baseline": "a", "candidate": "b", "design": "sequential", "threshold": 0.03,
          "metrics": {}, "counter_changes": [],
          "numerics": {"verdict": "changed", "limit": 1e-5, "band_kld": 0.0,
                       "max_kld": 0.1, "at": 3, "first_token_difference": 4,
                       "reason": "KL divergence 0.1 at generated position 3"}}
    current = dataclasses.replace(make_run("now", started_at=at(2)), ab=ab)
    result = compare([make_run("base")], current)
    assert result.regressed
    assert result.ab_numerics_changed
    assert "numbers changed" in comparison_markdown(result).splitlines()[0]


def test_the_record_keeps_the_top_tokens_by_id_rounded() -> None:
    with np.errstate(divide="ignore"):  # the unlisted tokens: log(0) = -inf
        log_probs = np.log(np.array([[0.05, 0.5, 0.05, 0.3, 0.1] + [0.0] * 20]))
    reported = ReportedDistributions((1,), (0,), log_probs)
    whole = record_fingerprint_of(reported)
    row = whole.rows[0]
    assert row is not None
    assert [t for t, _ in row] == [0, 1, 2, 3, 4]
    assert all(round(lp, 6) == lp for _, lp in row)
    wide = ReportedDistributions((1,), (0,), np.log(np.linspace(1, 2, 40))[None, :] - 10)
    kept = record_fingerprint_of(wide).rows[0]
    assert kept is not None
    assert [t for t, _ in kept] == list(range(40 - RECORD_TOP_N, 40))
    assert fingerprint_from_json(json.loads(json.dumps(whole.as_json()))) == whole


def test_a_record_with_fingerprints_passes_the_schema_and_round_trips() -> None:
    run = _run("with-numerics", {PROBE: _print()})
    assert run_from_json(json.loads(json.dumps(run.to_json()))) == run
    assert "numerics" not in _run("without", None).to_json()


@pytest.mark.parametrize(("where", "value"), [
    ("row key", {"01": -0.1}), ("row key", {"-1": -0.1}), ("row key", {"x": -0.1}),
    ("log-probability", {"3": 0.5}), ("log-probability", {"3": "-0.1"}),
    ("token", None),
])
def test_hostile_fingerprints_are_refused_by_the_schema(where: str, value: Any) -> None:
    body = _run("bad", {PROBE: _print()}).to_json()
    if where == "token":
        body["numerics"][PROBE]["tokens"][0] = -3
    else:
        body["numerics"][PROBE]["rows"][0] = value
    with pytest.raises(RunRecordError, match=r"\$\.numerics"):
        run_from_json(body)


def test_rows_that_disagree_with_the_tokens_are_not_compared() -> None:
    broken = _print()
    broken["rows"] = broken["rows"][:2]
    result = compare([_run("base", {PROBE: _print()})], _run("now", {PROBE: broken}))
    assert [p.comparison.verdict.value for p in result.numerics] == ["not measured"]
    assert "unreadable" in result.numerics[0].comparison.reason


def test_the_store_keeps_the_fingerprints(store: ResultsStore) -> None:
    run = _run("stored", {PROBE: _print(0.01)})
    store.add_run(run)
    assert store.get_run("stored") == run
