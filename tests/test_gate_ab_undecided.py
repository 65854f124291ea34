"""What an undecided A/B does to the gate job: ci/scripts/gate.sh's HARNESS_GATE_AB_UNDECIDED.

The script runs for real from a bare copy of the checkout, with stand-in ``harness`` and
``python3`` commands on PATH that record their arguments: the build prints a binary,
pytest writes an empty run record, and ``harness ab`` exits with the codes the test
gives it in turn (3: undecided), printing a table whose last line is an ``undecided:``
line as the real one's is. So these tests check the script's own control flow — the
rerun, the exit status, the summary section — in about a second each; what ``harness
ab`` prints and exits is tests/test_ab_undecided.py's.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
from gate_copy import bare_gate

_STAND_IN = """#!/usr/bin/env bash
name=$(basename "$0")
printf '%s\\n' "$name" "$@" >>"$GATE_CALLS"
printf '%s\\n' '---' >>"$GATE_CALLS"
if [ "$name" = python3 ]; then
  # pytest: the run record the A/B step then adds its result to.
  while [ $# -gt 0 ]; do
    if [ "$1" = --harness-run-record ]; then : >"$2"; fi
    shift
  done
  exit 0
fi
if [ "$1" = ab ]; then
  attempt=$(( $(cat "$GATE_AB_COUNT" 2>/dev/null || echo 0) + 1 ))
  echo "$attempt" >"$GATE_AB_COUNT"
  read -r -a codes <<<"$GATE_AB_EXITS"
  rc=${codes[$((attempt - 1))]}
  echo "A/B: candidate against baseline, attempt $attempt"
  if [ "$rc" = 3 ]; then echo "undecided: decode_tps: attempt $attempt"; fi
  exit "$rc"
fi
echo /stand-in/llama-server
"""


@dataclass(frozen=True)
class GateRun:
    done: subprocess.CompletedProcess[str]
    calls: list[list[str]]
    out: Path
    summary: Path

    @property
    def ab_calls(self) -> list[list[str]]:
        return [call[1:] for call in self.calls if call[:2] == ["harness", "ab"]]

    def detail(self) -> str:
        return f"exit {self.done.returncode}\n--- stderr\n{self.done.stderr[-4000:]}"


def _gate(tmp_path: Path, ab_exits: str, **settings: str) -> GateRun:
    """gate.sh cpu with HARNESS_GATE_AB_BASELINE=pin, ``harness ab`` exiting ``ab_exits``
    (one code per attempt), no results service."""
    script, bin_dir = bare_gate(tmp_path, _STAND_IN)
    calls, out, summary = tmp_path / "calls", tmp_path / "out", tmp_path / "summary.md"
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HARNESS_", "GITHUB_", "CI_"))}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        "GATE_CALLS": str(calls), "GATE_AB_COUNT": str(tmp_path / "ab-count"),
        "GATE_AB_EXITS": ab_exits,
        "HARNESS_GATE_RUNNER": "subprocess", "HARNESS_GATE_OUT": str(out),
        "HARNESS_GATE_SUMMARY": str(summary), "HARNESS_CACHE": str(tmp_path / "cache"),
        "HARNESS_GATE_AB_BASELINE": "pin",
        **settings,
    })
    done = subprocess.run([str(script), "cpu"], env=env, capture_output=True, text=True,
                          timeout=60, check=False)
    words = calls.read_text().split("\n---\n") if calls.exists() else []
    return GateRun(done, [call.split("\n") for call in words if call.strip()], out, summary)


def test_by_default_an_undecided_ab_is_rerun_once_then_fails_the_job(tmp_path: Path) -> None:
    run = _gate(tmp_path, "3 3")
    assert run.done.returncode == 3, run.detail()
    first, second = run.ab_calls
    # The same arguments both times: the same builds, run record and Allure folder.
    assert first == second
    assert first[first.index("--record") + 1] == str(run.out / "run.json")
    assert "gate: A/B against pin exit 3" in run.done.stderr
    # Both tables stay in ab.txt, the first above the rerun's.
    tables = (run.out / "ab.txt").read_text()
    assert tables.index("attempt 1") < tables.index("--- undecided: rerun") \
        < tables.index("attempt 2")
    summary = run.summary.read_text()
    assert "### A/B undecided\n" in summary
    assert "undecided twice (HARNESS_GATE_AB_UNDECIDED=rerun): the job fails (exit 3)" \
        in summary
    # The rerun's undecided lines, the ones that stand.
    assert "undecided: decode_tps: attempt 2" in summary
    assert "undecided: decode_tps: attempt 1" not in summary


def test_a_rerun_that_decides_passes_and_says_it_was_undecided_first(tmp_path: Path) -> None:
    run = _gate(tmp_path, "3 0")
    assert run.done.returncode == 0, run.detail()
    assert len(run.ab_calls) == 2
    summary = run.summary.read_text()
    assert "### A/B undecided, then decided" in summary
    assert "### A/B undecided\n" not in summary


def test_a_regression_is_not_rerun(tmp_path: Path) -> None:
    run = _gate(tmp_path, "1")
    assert run.done.returncode == 1, run.detail()
    assert len(run.ab_calls) == 1
    assert "A/B undecided" not in run.summary.read_text()


def test_fail_fails_the_job_on_the_first_undecided_ab(tmp_path: Path) -> None:
    run = _gate(tmp_path, "3", HARNESS_GATE_AB_UNDECIDED="fail")
    assert run.done.returncode == 3, run.detail()
    assert len(run.ab_calls) == 1
    summary = run.summary.read_text()
    assert "HARNESS_GATE_AB_UNDECIDED=fail: the job fails (exit 3)" in summary
    assert "undecided: decode_tps: attempt 1" in summary


def test_neutral_passes_the_job_but_still_writes_the_section(tmp_path: Path) -> None:
    run = _gate(tmp_path, "3", HARNESS_GATE_AB_UNDECIDED="neutral")
    assert run.done.returncode == 0, run.detail()
    assert len(run.ab_calls) == 1
    summary = run.summary.read_text()
    assert "### A/B undecided\n" in summary
    assert "HARNESS_GATE_AB_UNDECIDED=neutral: the job does not fail on it" in summary
    assert "undecided: decode_tps: attempt 1" in summary
    # An output folder used again starts without the earlier job's section.
    again = _gate(tmp_path / "again", "0", HARNESS_GATE_OUT=str(run.out))
    assert again.done.returncode == 0, again.detail()
    assert not (run.out / "ab-undecided.md").exists()
    assert "A/B undecided" not in again.summary.read_text()


@pytest.mark.parametrize("value", ["retry", "Fail", " "])
def test_a_bad_setting_is_refused_before_building(tmp_path: Path, value: str) -> None:
    run = _gate(tmp_path, "0", HARNESS_GATE_AB_UNDECIDED=value)
    assert run.done.returncode == 2, run.detail()
    assert ("HARNESS_GATE_AB_UNDECIDED must be rerun, fail or neutral (what an undecided "
            f"A/B does to the job), not '{value}'") in run.done.stderr
    assert run.calls == []  # nothing built, run or measured
