"""A quiet main job: planned fields a build cannot show are summed up once per field and
reason at the end of the run, not warned once per test, and still detailed per test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from checkout import REPO_ROOT

from harness.plugin.unverified import summary_lines
from harness.verdicts.unverifiable_fields import CPU_UNVERIFIABLE


def test_one_line_per_field_and_reason_with_its_count() -> None:
    lines = summary_lines({
        "t::a": {"n_gpu_layers": "no GPU", "spec_draft_n_max": "no drafter"},
        "t::b": {"n_gpu_layers": "no GPU"},
        "t::c": {"n_gpu_layers": "no GPU", "spec_draft_n_max": "no drafter"},
        "t::d": {"spec_draft_n_max": "another reason"},
    })
    assert lines == ["n_gpu_layers (3 tests): no GPU",
                     "spec_draft_n_max (2 tests): no drafter",
                     "spec_draft_n_max (1 test): another reason"]
    assert summary_lines({}) == []


@pytest.mark.server
def test_the_plan_forwarding_suite_sums_up_what_it_left_out(tmp_path: Path) -> None:
    """Two card flag-set tests on one xdist worker (the summary is the controller's, from
    the worker's reports, sent across as for any -n) on the CPU build: one section with
    each field once."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "suites/test_plan_forwarding.py", "-n", "1",
         "-k", "test_card_flag_set_scaled_to_the_fixture and (h200 or rtx-4090)",
         "-p", "no:cacheprovider",
         "--alluredir", str(results), "--harness-run-record", str(tmp_path / "run.json")],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "2 passed" in out, out[-2000:]
    assert "UnverifiedField" not in out, out[-4000:]
    assert "warnings summary" not in out, out[-4000:]
    header = next((line for line in out.splitlines() if "left unchecked in" in line), None)
    assert header is not None, out[-4000:]
    assert "left unchecked in 2 tests" in header, header
    section = out[out.index(header):]
    for field in ("n_gpu_layers", "split_mode", "main_gpu", "kv_offload"):
        line = f"{field} (2 tests): {CPU_UNVERIFIABLE[field]}"
        assert section.count(line) == 1, (line, section[:3000])
    # The per-test detail stays in each test's Allure result.
    attached = []
    for path in results.glob("*-result.json"):
        body = json.loads(path.read_text(encoding="utf-8"))
        attached += [a for a in body.get("attachments", []) if a["name"] == "unverified fields"]
    assert len(attached) == 2
    detail = json.loads((results / attached[0]["source"]).read_text(encoding="utf-8"))
    assert detail["backend"] == "cpu"
    assert detail["fields"]["n_gpu_layers"]["why"] == CPU_UNVERIFIABLE["n_gpu_layers"]
