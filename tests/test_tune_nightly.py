"""The nightly's stale-card check (``HARNESS_NIGHTLY_TUNE=1``, gate.sh step 2c) against a
real results service: a card with a poor micro-batch is reported stale in the run the
service stores, on its dashboard and in the job's summary, and the job still passes."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_gate_job import GATE, TOKEN, Service, run_service
from test_tune_real import CARD_NAME, card_folder

from harness import modelgen
from harness.ab.design_check import VALIDATION_ENV

pytestmark = [pytest.mark.server, pytest.mark.alone]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from run_service(tmp_path)


def test_a_stale_card_is_reported_to_the_service_without_failing_the_night(
        tmp_path: Path, service: Service) -> None:
    configs = card_folder(tmp_path / "configs", batch=4, ubatch=4)
    out = tmp_path / "out"
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("HARNESS_", "GITHUB_", "CI_"))}
    if "HARNESS_CACHE" in os.environ:
        env["HARNESS_CACHE"] = os.environ["HARNESS_CACHE"]
    model = modelgen.ensure_fixtures().model("bench")
    env.update({
        "HARNESS_GATE_RUNNER": "subprocess", "HARNESS_GATE_OUT": str(out),
        "HARNESS_GATE_SUMMARY": str(out / "summary.md"), "HARNESS_GATE_BASELINE": "",
        "HARNESS_GATE_WORKERS": "0",  # the smoke suite alone: no xdist start-up
        "HARNESS_BRANCH": "nightly/bench/tune-test",
        "HARNESS_SERVICE_URL": service.url, "HARNESS_SERVICE_TOKEN": TOKEN,
        "HARNESS_NIGHTLY_TUNE": "1",
        "HARNESS_NIGHTLY_TUNE_ARGS": (
            f"--model {model} --configs {configs} --gpu {CARD_NAME} --vram-mib 24564 "
            "--vary batch --metric prompt_tps --n-prompt 256 --budget-s 300 --seed 7"),
        VALIDATION_ENV: str(tmp_path / "ab-validation.json"),
    })
    done = subprocess.run([str(GATE), "cpu", "-k", "smoke"], env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    tune_txt = (out / "tune.txt").read_text() if (out / "tune.txt").exists() else ""
    assert done.returncode == 0, f"{done.stderr[-4000:]}\n{tune_txt[-4000:]}"
    assert "gate: stale-card check exit 0" in done.stderr
    assert "stale card: tune-test's plan for model:llama at context 2048" in tune_txt
    assert "### Stale card" in (out / "summary.md").read_text()
    run_id = (out / "run-id").read_text().strip()
    with httpx.Client(base_url=service.url, timeout=30) as client:
        stored = client.get(f"/api/runs/{run_id}").json()["run"]
        tune = stored["tune"]
        assert tune["stale"] is True
        assert tune["check"] is True
        assert tune["card"] == "tune-test"
        # Both alternatives run a 256-token prompt in one micro-batch: either may win.
        assert tune["winner"]["name"] in {"ubatch 256", "ubatch 512"}
        assert [f["verdict"] for f in tune["winner"]["figures"]] == ["improved"]
        # --check measured the plan against its two best alternatives.
        measured = [c for c in tune["candidates"] if c["figures"]]
        assert [c["name"] for c in measured] == ["ubatch 256", "ubatch 512"]
        hardware = f"{stored['hardware']['gpu']} | {stored['hardware']['cpu']}"
        page = client.get("/dashboard", params={"branch": "nightly/bench/tune-test",
                                                "hardware": hardware})
    assert page.status_code == 200
    assert "<strong>stale card</strong> (a warning)" in page.text
    assert f"stale: {tune['winner']['name']}" in page.text
