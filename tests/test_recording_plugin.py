"""The recording plugin end to end: a real pytest run of real suites, read back from disk.

Each test runs pytest in a child process (the harness plugin loads through its entry
point) with ``--alluredir`` and ``--harness-run-record``, then reads the Allure result
files and ``run.json`` it left: labels, attachments, the environment and categories
files, outcomes and figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from checkout import REPO_ROOT

from harness.probes.hardware import detect_hardware
from harness.results.run_record import RunRecord
from harness.results.run_validation import run_from_json

pytestmark = pytest.mark.server

SMOKE = "suites/test_smoke.py::test_fixture_serves[dense]"
ROUTING = "suites/test_routing.py::test_fused_dense_plan_arrives_on_the_server"
SERVER_ATTACHMENTS = ("server 1 argv", "server 1 verdicts", "server 1 /props",
                      "server 1 figures")


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    results: Path
    run: RunRecord

    def result(self, name: str) -> dict[str, Any]:
        """The Allure result of the test called ``name`` (one, or the test fails)."""
        found: list[dict[str, Any]] = []
        for path in self.results.glob("*-result.json"):
            body = json.loads(path.read_text(encoding="utf-8"))
            if body["name"] == name:
                found.append(body)
        assert len(found) == 1, f"{len(found)} results named {name!r}:\n{self.output}"
        return found[0]

    def attachment(self, result: dict[str, Any], name: str) -> str:
        sources = [a["source"] for a in result.get("attachments", []) if a["name"] == name]
        assert len(sources) == 1, (name, [a["name"] for a in result.get("attachments", [])])
        path = self.results / sources[0]
        assert path.is_file(), f"attachment {name!r} names {path}, which is not there"
        text: str = path.read_text(encoding="utf-8")
        return text


def _pytest(tmp_path: Path, *args: str, cwd: Path = REPO_ROOT) -> Run:
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "HARNESS_RUN_", "HARNESS_BRANCH"))}
    env.update(HARNESS_RUN_ID="plugin-e2e", HARNESS_BRANCH="e2e-branch")
    results = tmp_path / "results"
    run_json = tmp_path / "run.json"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *args, "-p", "no:xdist", "-p", "no:cacheprovider",
         "-o", "addopts=", "-q", "--alluredir", str(results),
         "--harness-run-record", str(run_json)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert run_json.is_file(), f"no run.json after the run:\n{output}"
    record = run_from_json(json.loads(run_json.read_text(encoding="utf-8")))
    return Run(done.returncode, output, results, record)


def _labels(result: dict[str, Any], name: str) -> list[str]:
    return [label["value"] for label in result["labels"] if label["name"] == name]


def test_passing_suite_tests_are_labelled_attached_and_recorded(tmp_path: Path) -> None:
    run = _pytest(tmp_path, SMOKE, ROUTING)
    assert run.returncode == 0, run.output

    # Labels: the hardware is the parent suite, the module the suite, its feature.
    smoke = run.result("test_fixture_serves[dense]")
    assert smoke["status"] == "passed"
    assert _labels(smoke, "parentSuite") == [detect_hardware().describe()]
    assert _labels(smoke, "suite") == ["test_smoke"]
    assert _labels(smoke, "feature") == ["smoke"]
    assert _labels(smoke, "backend") == ["cpu"]
    assert _labels(smoke, "fixture") == ["dense"]

    # One server, nothing planned: its story, with the log trimmed for a pass.
    for name in SERVER_ATTACHMENTS:
        run.attachment(smoke, name)
    assert not any(a["name"].startswith("plan ") for a in smoke["attachments"])
    argv = run.attachment(smoke, "server 1 argv")
    assert "llama-server" in argv
    assert "dense.gguf" in argv
    verdicts = json.loads(run.attachment(smoke, "server 1 verdicts"))
    assert (verdicts["served"], verdicts["gpu_use"]["passed"]) == (True, True)
    props = json.loads(run.attachment(smoke, "server 1 /props"))
    assert props["model_path"].endswith("dense.gguf")
    figures = json.loads(run.attachment(smoke, "server 1 figures"))
    assert figures["key"]["fixture"] == "dense"
    assert figures["figures"]["decode_tps"] > 0
    log = run.attachment(smoke, "server 1 startup log (trimmed)")
    assert "lines left out (the test passed" in log

    # The routing test planned: its plan, with each field's origin and the reasons.
    routing = run.result("test_fused_dense_plan_arrives_on_the_server")
    assert _labels(routing, "suite") == ["test_routing"]
    assert _labels(routing, "feature") == ["routing"]
    assert _labels(routing, "fixture") == ["tiny-dense"]
    plan = json.loads(run.attachment(routing, "plan 1"))
    assert plan["fields"], plan
    assert all({"value", "origin"} <= set(field) for field in plan["fields"].values())
    assert plan["reasons"], plan
    assert "--spec-draft-model" in plan["argv"]
    run.attachment(routing, "server 1 startup log (trimmed)")

    # The run-level files of the results folder.
    environment = (run.results / "environment.properties").read_text(encoding="utf-8")
    assert "build.backend=cpu" in environment
    assert "gpu.name=none" in environment
    categories = json.loads((run.results / "categories.json").read_text(encoding="utf-8"))
    assert isinstance(categories, list)
    assert categories

    # run.json: who ran, both outcomes, the figures of the dense server.
    record = run.run
    assert (record.run_id, record.branch) == ("plugin-e2e", "e2e-branch")
    assert record.hardware == detect_hardware()
    assert record.build.backend == "cpu"
    outcomes = {o.test_id: o.outcome for o in record.outcomes}
    assert outcomes == {SMOKE: "passed", ROUTING: "passed"}
    dense = {f.metric: f.value for f in record.figures
             if f.test_id == SMOKE and f.key.fixture == "dense"}
    assert dense["decode_tps"] > 0
    assert {"prompt_tps", "ttft_ms", "load_s", "kv_mib", "peak_host_mib"} <= set(dense)
    assert {f.test_id for f in record.figures} == {SMOKE, ROUTING}
    _assert_decode_predicted(record)


def _assert_decode_predicted(record: RunRecord) -> None:
    """The bandwidth model's decode speed beside the measured one, on no other metric."""
    (decode,) = (f for f in record.figures if f.test_id == SMOKE
                 and f.key.fixture == "dense" and f.metric == "decode_tps")
    assert decode.predicted is not None
    assert decode.predicted > 0
    assert decode.ratio == decode.value / decode.predicted
    assert all(f.predicted is None for f in record.figures if f.metric != "decode_tps")
    for written in record.to_json()["figures"]:
        assert ("predicted" in written) == ("ratio" in written) == (
            written["metric"] == "decode_tps")


FAILING_TEST = """
from harness import modelgen
from harness.planning.launch import LaunchSpec
from harness.plugin import StartServer


def test_serves_then_fails(fixture_set: modelgen.FixtureSet,
                           start_server: StartServer) -> None:
    start_server(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512))
    assert False, "failed on purpose"
"""


def test_a_failing_test_keeps_the_whole_startup_log(tmp_path: Path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_fails.py").write_text(textwrap.dedent(FAILING_TEST), encoding="utf-8")
    run = _pytest(tmp_path, "--rootdir", str(suite), "test_fails.py", cwd=suite)
    assert run.returncode == 1, run.output

    result = run.result("test_serves_then_fails")
    assert result["status"] == "failed"
    assert _labels(result, "suite") == ["test_fails"]
    assert _labels(result, "feature") == ["fails"]
    names = [a["name"] for a in result["attachments"]]
    assert "server 1 startup log" in names
    assert "server 1 startup log (trimmed)" not in names
    log = run.attachment(result, "server 1 startup log")
    assert "lines left out" not in log
    assert "llama_kv_cache" in log
    assert len(log.splitlines()) > 120, "a start log is longer than what a pass keeps"
    # The server was still measured before the fixture stopped it.
    run.attachment(result, "server 1 figures")

    (outcome,) = run.run.outcomes
    assert (outcome.test_id, outcome.outcome) == ("test_fails.py::test_serves_then_fails",
                                                  "failed")
    assert outcome.message is not None
    assert "failed on purpose" in outcome.message


def test_a_unit_test_run_with_allure_names_no_build_and_builds_none(tmp_path: Path) -> None:
    """No server, no run record: the environment file has the machine but no build.

    The cache is an empty folder, so had the session end tried to resolve the build it
    would have started a llama.cpp build (minutes) or failed; it must do neither.
    """
    (tmp_path / "test_plain.py").write_text("def test_plain() -> None:\n    assert True\n")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "HARNESS_"))}
    env["HARNESS_CACHE"] = str(tmp_path / "empty-cache")
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_plain.py", "-p", "no:xdist",
         "-p", "no:cacheprovider", "-o", "addopts=", "-q", "--alluredir", str(results)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    properties = (results / "environment.properties").read_text(encoding="utf-8")
    assert "host=" in properties
    assert "build." not in properties, properties
    assert (results / "categories.json").is_file()
    assert not (tmp_path / "empty-cache" / "builds").exists()
