"""The gate end to end: real suite runs stored, then ``harness compare`` decides.

Twelve baseline runs and a rerun of the same build, and one run made slower for real;
each is a real pytest session of the performance suite against the real server, with
its run record stored in a SQLite store. The rerun must pass the gate (exit 0) and the
slow run must fail it (exit 1) with decode speed among the regressions.

The slow run gets a quarter of one CPU (a CFS quota on a cgroup of its own), the way a
starved runner or a build that lost its threading would be slow. Fewer threads alone
(2 -> 1) costs this memory-bound fixture only about 25 % here, while decode speed moves
by 5-8 % from run to run on this VM (benchmarks/detector_quality.py measures that), so
the verdict on it would be a coin toss that says nothing about the gate. Twelve
baseline runs keep the rerun's chance of a false alarm (the z rule's t-distribution
tail, whatever the noise) near 0.75 % per speed figure.

Marked ``alone``: scripts/test.sh runs these tests after the parallel run, one at a
time, because a neighbour's load on two cores would be part of what they measure.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from checkout import REPO_ROOT

from harness.builds.under_test import BuildUnderTest

pytestmark = [pytest.mark.server, pytest.mark.alone]

HARNESS = [str(Path(sys.executable).with_name("harness"))]
BASELINE_RUNS = 12
#: A quarter of one CPU: CFS lets the group run 25 ms in every 100 ms.
QUOTA_US, PERIOD_US = 25_000, 100_000
CGROUP_V1_CPU = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


@contextlib.contextmanager
def starved_cgroup() -> Iterator[Path]:
    """A cgroup whose processes share a quarter of a CPU; its ``cgroup.procs`` path."""
    name = f"harness-slow-{uuid.uuid4().hex[:8]}"
    if (CGROUP_V1_CPU / "cpu.cfs_quota_us").exists():
        group = CGROUP_V1_CPU / name
        group.mkdir()
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
    elif "cpu" in (CGROUP_V2 / "cgroup.controllers").read_text().split():
        group = CGROUP_V2 / name
        group.mkdir()
        (group / "cpu.max").write_text(f"{QUOTA_US} {PERIOD_US}")
    else:
        pytest.fail("no cgroup CPU controller to slow a run with (cgroup v1 cpu or v2 "
                    "cpu.max); the gate test needs one, as root")
    try:
        yield group / "cgroup.procs"
    finally:
        for pid in (group / "cgroup.procs").read_text().split():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), 9)
        group.rmdir()


def _suite_run(tmp: Path, run_id: str, branch: str, binary: Path,
               cgroup_procs: Path | None = None) -> Path:
    run_json = tmp / f"{run_id}.json"
    env = {**os.environ, "HARNESS_RUN_ID": run_id, "HARNESS_BRANCH": branch,
           "HARNESS_THREADS": "2"}
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_XDIST_WORKER_COUNT", None)

    def join_cgroup() -> None:
        if cgroup_procs is not None:
            cgroup_procs.write_text(str(os.getpid()))

    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_performance.py", "-q",
         "-p", "no:xdist", "-p", "no:cacheprovider", "-o", "addopts=",
         f"--harness-server-bin={binary}", f"--harness-run-record={run_json}"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False,
        preexec_fn=join_cgroup)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    figures = json.loads(run_json.read_text())["figures"]
    assert any(f["metric"] == "decode_tps" for f in figures), figures
    return run_json


def _store(store_url: str, run_jsons: list[Path]) -> None:
    stored = subprocess.run([*HARNESS, "store", *map(str, run_jsons), "--results-url",
                             store_url], capture_output=True, text=True, timeout=120,
                            check=False)
    assert stored.returncode == 0, stored.stderr
    assert stored.stdout.count("stored: run ") == len(run_jsons), stored.stdout


def _compare(store_url: str, current: str, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*HARNESS, "compare", "--baseline", "main", "--current", current,
         "--window", str(BASELINE_RUNS), "--results-url", store_url, "--format", "json",
         "--output", str(out)],
        capture_output=True, text=True, timeout=120, check=False)


def test_compare_passes_a_rerun_and_fails_a_slowed_run(tmp_path: Path,
                                                        harness_build: BuildUnderTest) -> None:
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    binary = harness_build.binary
    # The rerun sits in the middle of the baseline runs, as an A/B would, so slow drift
    # of the machine's speed falls on both alike.
    runs = []
    for number in range(1, BASELINE_RUNS + 1):
        runs.append(_suite_run(tmp_path, f"base-{number}", "main", binary))
        if number == BASELINE_RUNS // 2:
            runs.append(_suite_run(tmp_path, "rerun", "candidate", binary))
    with starved_cgroup() as procs:
        runs.append(_suite_run(tmp_path, "slowed", "candidate-slow", binary, procs))
    _store(store_url, runs)  # all at once, as a night's records would be

    rerun = _compare(store_url, "rerun", tmp_path / "rerun.json")
    assert rerun.returncode == 0, rerun.stdout + rerun.stderr
    slowed = _compare(store_url, "slowed", tmp_path / "slowed.json")
    assert slowed.returncode == 1, slowed.stdout + slowed.stderr
    verdict = json.loads((tmp_path / "slowed.json").read_text())
    regressed = {f["metric"] for f in verdict["figures"]
                 if f["status"] == "regressed"}
    assert "decode_tps" in regressed, json.dumps(verdict["figures"], indent=1)
