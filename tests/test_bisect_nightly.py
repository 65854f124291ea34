"""The nightly's bisect (``HARNESS_NIGHTLY_BISECT=1``): from a comparison that found a
regression to the culprit, attached to the run in a real results service."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from llama_history import History, flag_history
from results_fixtures import at, make_run, outcome
from test_gate_job import TOKEN, Service, run_service
from test_service import GZIP, bundle_bytes

from harness.bisect.nightly import BisectPlan, plan_bisect
from harness.plugin.recording.source_labels import COMMIT_LABEL

FORWARDING = "suites/test_plan_forwarding.py::test_plan_reaches_the_server[dense-batch256-ubatch64]"
GOOD, BAD = "a" * 40, "b" * 40


def _comparison(failing: list[str], regressed: list[tuple[str, str]]) -> dict[str, object]:
    return {"tests": {"newly_failing": [{"test_id": t} for t in failing]},
            "figures": [{"status": "regressed", "metric": m, "key": {"fixture": f}}
                        for m, f in regressed]}


def test_newly_failing_tests_are_the_oracle_before_a_regressed_figure() -> None:
    plan = plan_bisect(_comparison([FORWARDING, "tests/test_x.py::t"],
                                   [("decode_tps", "bench")]),
                       {COMMIT_LABEL: GOOD}, {COMMIT_LABEL: BAD})
    assert plan == BisectPlan(GOOD, BAD, ("--test", FORWARDING), "1 test(s) newly failing")


def test_a_regressed_figure_is_bisected_by_its_metric_on_its_fixture() -> None:
    plan = plan_bisect(_comparison([], [("decode_tps", "bench"), ("load_s", "tiny")]),
                       {COMMIT_LABEL: GOOD}, {COMMIT_LABEL: BAD})
    assert isinstance(plan, BisectPlan)
    assert plan.oracle == ("--metric", "decode_tps", "--fixture", "bench")


@pytest.mark.parametrize(("baseline", "current", "said"), [
    ({}, {COMMIT_LABEL: BAD}, "do not name their build's commit"),
    ({COMMIT_LABEL: BAD}, {COMMIT_LABEL: BAD}, "built from the same commit"),
])
def test_runs_that_cannot_be_bisected_say_why(baseline: dict[str, str],
                                             current: dict[str, str], said: str) -> None:
    plan = plan_bisect(_comparison([FORWARDING], []), baseline, current)
    assert isinstance(plan, str)
    assert said in plan
    assert "no newly failing" in str(plan_bisect(_comparison([], []), {}, {}))


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from run_service(tmp_path)


@pytest.mark.server
@pytest.mark.timeout(1800)
@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_nightly_regression_gets_its_culprit_attached_in_the_service(
        tmp_path: Path, service: Service) -> None:
    history: History = flag_history(tmp_path / "history")
    runs = [make_run("night-1", branch="nightly/dense/cpu", started_at=at(1),
                     outcomes=[outcome(FORWARDING, "passed")],
                     labels={COMMIT_LABEL: history.shas[0], "source.subject": "pin"}),
            make_run("night-2", branch="nightly/dense/cpu", started_at=at(2),
                     outcomes=[outcome(FORWARDING, "failed")],
                     labels={COMMIT_LABEL: history.shas[-1]})]
    with httpx.Client(base_url=service.url) as client:
        for run in runs:
            stored = client.post("/api/runs", content=bundle_bytes(tmp_path, run),
                                 headers={**GZIP, "Authorization": f"Bearer {TOKEN}"})
            assert stored.status_code == 201, stored.text
        done = subprocess.run(
            [sys.executable, "-m", "harness.bisect.nightly", "--service", service.url,
             "--run", "night-2", "--baseline", "nightly/dense/cpu", "--source",
             str(history.tree), "--out", str(tmp_path / "bisect")],
            capture_output=True, text=True, timeout=1700, check=False,
            env={**os.environ, "HARNESS_SERVICE_TOKEN": TOKEN})
        assert done.returncode == 0, done.stderr
        assert "1 test(s) newly failing" in done.stderr
        stored_run = client.get("/api/runs/night-2").json()["run"]
    culprit = history.index("common: rename --ubatch-size")
    assert stored_run["bisect"]["first_bad"] == {"sha": history.shas[culprit],
                                                 "subject": history.subjects[culprit]}
    assert stored_run["bisect"]["oracle"] == f"tests: {FORWARDING}"
    # Another write to the same run needs the token.
    with httpx.Client(base_url=service.url) as client:
        refused = client.put("/api/runs/night-2/bisect", content=b"{}",
                             headers={"Content-Type": "application/json"})
    assert refused.status_code == 401
