"""The CI gate job, run here end to end on the CPU path: ci/scripts/gate.sh itself.

A real ``harness serve`` on loopback stands in for the results service. The script runs
twice, as CI would: once on main (the baseline, uploaded and not compared) and once on a
pull-request branch (uploaded, then compared through ``harness compare --service``). The
build is the cached CPU build; the suites are cut down with ``-k`` to keep it short. CI's
CPU job takes the container runner; here HARNESS_GATE_RUNNER=subprocess runs the same
script on the native build, so no Docker engine is needed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import service_helpers

from harness.builds.slowed import SLOW_DECODE_ENV, slowed_source, wait_for_slowdown
from harness.paths import cache_root

pytestmark = [pytest.mark.server]
#: The tests whose verdicts are speed judgements (an A/B) run alone; the refusals and the
#: baseline-then-pull-request run judge no speed and run in parallel.
alone = pytest.mark.alone

ROOT = Path(__file__).resolve().parent.parent
GATE = ROOT / "ci" / "scripts" / "gate.sh"
TOKEN = "gate-job-token-" + "k" * 24
SUITES = "routing or performance or smoke"
GATE_TIMEOUT_S = 300
#: The A/B step's settings where the candidate is slowed: it regresses in a few pairs.
AB_ARGS = "--metric decode_tps --budget-s 100"
#: Where both arms are one build: an A/A runs to its budget (showing "unchanged" at 3 %
#: takes more pairs than these tests need, so it may end undecided, which the test lets
#: pass with HARNESS_GATE_AB_UNDECIDED=neutral; tests/test_ab_cli.py holds the
#: statistics). A
#: shorter budget cannot add false alarms: blocks are the same size whatever the budget,
#: so the looks at the pairs are the same ones, only fewer. (A false "regressed" after
#: 6 pairs, seen once on a noisy host at 40 s, would have been the same first look at 100 s.)
#: No extension past the budget: an A/A interval excluding 1 by chance would measure on.
AB_SAME_BUILD_ARGS = "--metric decode_tps --budget-s 15 --extend-s 0"


@dataclass(frozen=True)
class Service:
    url: str
    data_dir: Path


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from run_service(tmp_path)


def run_service(tmp_path: Path) -> Iterator[Service]:
    """``harness serve`` in a child process, with its own data directory and store."""
    port = service_helpers.free_port()
    data_dir = tmp_path / "service"
    log = (tmp_path / "serve.log").open("w")
    env = {**os.environ, "HARNESS_SERVICE_TOKEN": TOKEN}
    argv = [str(Path(sys.executable).with_name("harness")), "serve", "--host", "127.0.0.1",
            "--port", str(port), "--data-dir", str(data_dir),
            "--results-url", f"sqlite:///{tmp_path / 'results.sqlite'}"]
    with log, subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT) as server:
        try:
            url = f"http://127.0.0.1:{port}"
            service_helpers.wait_healthy(url, server, tmp_path / "serve.log")
            yield Service(url, data_dir)
        finally:
            server.terminate()
            server.wait(30)


def _gate(service: Service, out: Path, summary: Path, *, branch: str, baseline: str,
          suites: str = SUITES) -> subprocess.CompletedProcess[str]:
    # The job's environment, as a workflow sets it; nothing of this shell's CI or
    # harness settings leaks in (HARNESS_CACHE stays: it holds the cached build).
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HARNESS_", "GITHUB_", "CI_"))}
    if "HARNESS_CACHE" in os.environ:
        env["HARNESS_CACHE"] = os.environ["HARNESS_CACHE"]
    env.update({
        "HARNESS_GATE_RUNNER": "subprocess",
        "HARNESS_GATE_OUT": str(out),
        "HARNESS_GATE_SUMMARY": str(summary),
        "HARNESS_GATE_BASELINE": baseline,
        "HARNESS_GATE_WORKERS": "2",
        "HARNESS_SERVICE_URL": service.url,
        "HARNESS_SERVICE_TOKEN": TOKEN,
        "HARNESS_BRANCH": branch,
        "HARNESS_COMMIT": f"commit-on-{branch}",
    })
    return subprocess.run([str(GATE), "cpu", "-k", suites], env=env, capture_output=True,
                          text=True, timeout=GATE_TIMEOUT_S, check=False)


def _detail(done: subprocess.CompletedProcess[str]) -> str:
    return f"exit {done.returncode}\n--- stdout\n{done.stdout[-4000:]}\n--- stderr\n" \
           f"{done.stderr[-6000:]}"


# Not alone: with one baseline run no figure is judged (the noise rule needs
# NOISE_MIN_RUNS), so the comparison is of test outcomes, not of speed.
def test_the_gate_job_stores_a_baseline_then_compares_a_pull_request(
        service: Service, tmp_path: Path) -> None:
    main_out, pr_out = tmp_path / "main", tmp_path / "pr"
    main_summary, pr_summary = tmp_path / "main.md", tmp_path / "pr.md"

    baseline = _gate(service, main_out, main_summary, branch="main", baseline="")
    assert baseline.returncode == 0, _detail(baseline)
    main_id = (main_out / "run-id").read_text().strip()
    assert f"stored run {main_id} (new)" in baseline.stdout
    assert "Run `" + main_id + "` stored as a baseline" in main_summary.read_text()
    record = json.loads((main_out / "run.json").read_text())
    assert (record["run_id"], record["branch"]) == (main_id, "main")
    assert record["outcomes"], "the run record holds no test outcomes"
    assert (main_out / "report" / "index.html").is_file()

    pull = _gate(service, pr_out, pr_summary, branch="feature/gate", baseline="main")
    assert pull.returncode == 0, _detail(pull)
    pr_id = (pr_out / "run-id").read_text().strip()
    assert pr_id != main_id
    summary = pr_summary.read_text()
    assert summary.startswith("## ✅ No regression"), summary
    assert f"Run `{pr_id}` against baseline `{main_id}`" in summary
    assert f"{service.url}/runs/{pr_id}/report/" in summary
    # The comparison is printed to the job log as well as into the summary file.
    assert summary in pull.stdout

    runs = httpx.get(f"{service.url}/api/runs", timeout=10).json()["runs"]
    assert {(run["run_id"], run["branch"]) for run in runs} == {
        (main_id, "main"), (pr_id, "feature/gate")}


def test_an_unknown_baseline_fails_the_job_with_exit_2(service: Service,
                                                       tmp_path: Path) -> None:
    done = _gate(service, tmp_path / "out", tmp_path / "summary.md", branch="lonely",
                 baseline="no-such-branch", suites="performance")
    assert done.returncode == 2, _detail(done)
    assert "baseline 'no-such-branch'" in done.stderr
    assert "compare 2" in done.stderr
    # The run was still uploaded: the report and the record exist for a red gate.
    runs = httpx.get(f"{service.url}/api/runs", timeout=10).json()["runs"]
    assert [run["branch"] for run in runs] == ["lonely"]
    assert (tmp_path / "out" / "report" / "index.html").is_file()


def _ab_gate(out: Path, *, source: Path | None = None, slow_us: int | None = None,
             baseline: str = "pin", ab_args: str = AB_ARGS,
             undecided: str = "rerun") -> subprocess.CompletedProcess[str]:
    """The gate with HARNESS_GATE_AB_BASELINE=``baseline``, no service, the smoke suite only."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HARNESS_", "GITHUB_", "CI_"))}
    if "HARNESS_CACHE" in os.environ:
        env["HARNESS_CACHE"] = os.environ["HARNESS_CACHE"]
    env.update({
        "HARNESS_GATE_RUNNER": "subprocess", "HARNESS_GATE_OUT": str(out),
        "HARNESS_GATE_SUMMARY": str(out / "summary.md"), "HARNESS_GATE_BASELINE": "",
        # No xdist: the smoke suite's 11 tests take 4.7 s on their own and 6.1 s (twice
        # the CPU) with two workers starting; the job with workers is the test above's.
        "HARNESS_GATE_WORKERS": "0", "HARNESS_BRANCH": "feature/ab",
        "HARNESS_GATE_AB_BASELINE": baseline,
        "HARNESS_GATE_AB_ARGS": ab_args, "HARNESS_GATE_AB_UNDECIDED": undecided,
    })
    if source is not None:
        env["HARNESS_SOURCE"] = str(source)
    if slow_us is not None:
        env[SLOW_DECODE_ENV] = str(slow_us)
    return subprocess.run([str(GATE), "cpu", "-k", "smoke"], env=env, capture_output=True,
                          text=True, timeout=GATE_TIMEOUT_S, check=False)


@alone
def test_the_gate_ab_step_fails_a_slowed_candidate(tmp_path: Path) -> None:
    # The build under test is the slowed tree (harness/builds/slowed.py), 30 % slower.
    source = slowed_source(cache_root())
    done = _ab_gate(tmp_path / "out", source=source,
                    slow_us=wait_for_slowdown(0.30, 800.0))
    assert done.returncode == 1, _detail(done)
    assert "gate: A/B against pin exit 1" in done.stderr
    ab = json.loads((tmp_path / "out" / "run.json").read_text())["ab"]
    assert ab["metrics"]["decode_tps"]["verdict"] == "regressed"
    assert (tmp_path / "out" / "ab.txt").read_text().startswith("A/B: candidate")


def _git(tree: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(tree), "-c", "user.name=harness", "-c",
                    "user.email=harness@localhost", *args], check=True, capture_output=True)


@alone
def test_the_gate_ab_step_builds_a_git_ref_of_the_source_as_its_baseline(
        tmp_path: Path) -> None:
    # A llama.cpp checkout whose tagged commit holds the slowed tree's files, so both the
    # ref's archive and the working tree hash to the slowed build already in the cache:
    # the ref path runs for real (git archive, harness build --source, harness ab) and
    # builds nothing. Same build both sides: the A/B must pass.
    checkout = tmp_path / "llama.cpp"
    shutil.copytree(slowed_source(cache_root()), checkout, symlinks=True)
    _git(checkout, "init", "-q")
    _git(checkout, "add", "-A", "-f")
    _git(checkout, "commit", "-q", "-m", "the slowed tree")
    _git(checkout, "tag", "ab-base")
    done = _ab_gate(tmp_path / "out", source=checkout, baseline="ab-base",
                    ab_args=AB_SAME_BUILD_ARGS, undecided="neutral")
    assert done.returncode == 0, _detail(done)
    # Decided (0), or undecided in the short budget (3), which neutral lets pass but
    # still writes into the summary; never regressed.
    if "gate: A/B against ab-base exit 3" in done.stderr:
        assert "### A/B undecided" in (tmp_path / "out" / "summary.md").read_text()
    else:
        assert "gate: A/B against ab-base exit 0" in done.stderr
    # The ref was unpacked from git, not read from the working tree.
    unpacked = tmp_path / "out" / "ab-baseline-source"
    assert (unpacked / "CMakeLists.txt").is_file()
    assert not (unpacked / ".git").exists()
    ab = json.loads((tmp_path / "out" / "run.json").read_text())["ab"]
    # Both arms resolved to the one cached build of that content.
    assert ab["baseline"] == ab["candidate"], ab
    assert ab["metrics"]["decode_tps"]["verdict"] != "regressed"


def test_a_git_ref_baseline_without_a_source_checkout_is_refused(tmp_path: Path) -> None:
    done = _ab_gate(tmp_path / "out", baseline="main")
    assert done.returncode == 2, _detail(done)
    assert "HARNESS_GATE_AB_BASELINE=main is a git ref, which needs HARNESS_SOURCE" \
        in done.stderr
    # Refused before the build and the suites: nothing was run or recorded.
    assert "gate: suites exit" not in done.stderr
    assert not (tmp_path / "out" / "run.json").exists()
