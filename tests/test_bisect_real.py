"""``harness bisect`` on real llama-server builds: a git history written from the pinned
source, each probe exported, built through the cache and ccache, and judged.

The history: the pinned tree, a docs commit, a commit that breaks the configure step,
its fix, a commit that renames ``--ubatch-size`` (the culprit), another docs commit.
The first run compiles each probed commit (about 30 s each on 2 cores with ccache); the
builds stay in the harness cache, so later runs of this test are cache hits.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from llama_history import History, flag_history, numerics_history, slow_history

HARNESS = [sys.executable, "-c", "from harness.commands import main; main()"]
FORWARDING = "suites/test_plan_forwarding.py::test_plan_reaches_the_server[dense-batch256-ubatch64]"
NUMERICS = "suites/test_numerics.py::test_distributions_match_the_reference[bench-f16]"

pytestmark = [pytest.mark.server, pytest.mark.timeout(1800),
              pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")]


@pytest.fixture(scope="module")
def history(tmp_path_factory: pytest.TempPathFactory) -> History:
    return flag_history(tmp_path_factory.mktemp("history"))


@pytest.fixture(scope="module")
def slowed(tmp_path_factory: pytest.TempPathFactory) -> History:
    return slow_history(tmp_path_factory.mktemp("slowed"))


def _bisect(history: History, out: Path, *oracle: str, bad: str = "master",
            exit_code: int = 0) -> dict[str, object]:
    done = subprocess.run([*HARNESS, "bisect", "--source", str(history.tree),
                           "--good", history.shas[0], "--bad", bad, *oracle,
                           "--out", str(out), "--json"],
                          capture_output=True, text=True, timeout=1700, check=False)
    assert done.returncode == exit_code, done.stderr
    result: dict[str, object] = json.loads(done.stdout)
    return result


def _verdicts(result: dict[str, object]) -> dict[str, str]:
    probes = result["probes"]
    assert isinstance(probes, list)
    return {p["commit"]: p["verdict"] for p in probes}


def test_a_script_oracle_names_the_commit_that_renamed_the_flag(history: History,
                                                                tmp_path: Path) -> None:
    result = _bisect(history, tmp_path, "--script",
                     '"$HARNESS_BISECT_BINARY" --help | grep -q -- --ubatch-size')
    culprit = history.index("common: rename --ubatch-size")
    assert result["first_bad"] == {"sha": history.shas[culprit],
                                   "subject": history.subjects[culprit]}
    broken = history.shas[history.index("server: a change that breaks")]
    assert _verdicts(result)[broken] == "skip"


def test_the_plan_forwarding_test_as_oracle_names_the_same_commit(history: History,
                                                                 tmp_path: Path) -> None:
    result = _bisect(history, tmp_path, "--test", FORWARDING)
    culprit = history.index("common: rename --ubatch-size")
    assert result["first_bad"] == {"sha": history.shas[culprit],
                                   "subject": history.subjects[culprit]}
    probes = result["probes"]
    assert isinstance(probes, list)
    evidence = {p["commit"]: p["evidence"] for p in probes}
    # The renamed flag is one the plan needs: its test skips with the reason on the
    # bad side, which the oracle counts as bad.
    assert "not supported by this build: --ubatch-size" in evidence[history.shas[culprit]]
    assert evidence[history.shas[0]] == "passed"


@pytest.mark.alone  # it measures speed: nothing may run beside it
def test_the_decode_metric_names_the_commit_that_slowed_decode(slowed: History,
                                                               tmp_path: Path) -> None:
    result = _bisect(slowed, tmp_path, "--metric", "decode_tps")
    culprit = slowed.index("server: a wait after each token")
    assert result["first_bad"] == {"sha": slowed.shas[culprit],
                                   "subject": slowed.subjects[culprit]}
    probes = result["probes"]
    assert isinstance(probes, list)
    said = {p["commit"]: p for p in probes}
    broken = slowed.shas[slowed.index("server: a change that breaks")]
    assert said[broken]["verdict"] == "skip"
    assert said[broken]["evidence"].startswith("build failed:")
    # The bad endpoint and the culprit measured regressed against the good build.
    for sha in (slowed.shas[-1], slowed.shas[culprit]):
        assert said[sha]["verdict"] == "bad"
        assert "decode_tps" in said[sha]["evidence"]
        assert "vs good: regressed" in said[sha]["evidence"]


@pytest.mark.alone
def test_endpoints_that_measure_the_same_are_not_bisected(slowed: History,
                                                          tmp_path: Path) -> None:
    fixed = slowed.shas[slowed.index("server: the configure step fixed")]
    result = _bisect(slowed, tmp_path, "--metric", "decode_tps", "--ab-budget-s", "15",
                     bad=fixed, exit_code=2)
    assert result["reproduced"] is False
    probes = result["probes"]
    assert isinstance(probes, list)
    assert [p["commit"] for p in probes] == [slowed.shas[0], fixed]
    assert probes[1]["verdict"] in ("good", "undecided")
    assert "decode_tps" in probes[1]["evidence"]


def test_the_numerics_test_as_oracle_names_the_commit_that_moved_rope(
        tmp_path_factory: pytest.TempPathFactory, tmp_path: Path) -> None:
    """A build that computes wrong numbers, found in a history by what it computes."""
    history = numerics_history(tmp_path_factory.mktemp("numerics"))
    result = _bisect(history, tmp_path, "--test", NUMERICS)
    culprit = history.index("ggml-cpu: rope frequency scale")
    assert result["first_bad"] == {"sha": history.shas[culprit],
                                   "subject": history.subjects[culprit]}
    probes = result["probes"]
    assert isinstance(probes, list)
    evidence = {p["commit"]: p["evidence"] for p in probes}
    assert "KL divergence from the reference" in evidence[history.shas[culprit]]
