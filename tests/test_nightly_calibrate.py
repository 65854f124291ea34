"""Nightly runs to measured card figures, end to end: ci/scripts/nightly.sh, then calibrate.

A real ``harness serve`` on loopback holds the nights. The nightly script runs two nights
of one cell here on the CPU path (the native build, HARNESS_GATE_RUNNER=subprocess) and,
where Docker answers, two on the Vulkan path (the Vulkan image, llvmpipe as its device),
each cut down with ``-k`` to one smoke test (the dense fixture). ``harness calibrate`` then
reads the nights back over HTTP with card configs that include test cards for what this
machine reports — its CPU model for the CPU runs, ``llvmpipe`` for the Vulkan ones — and
writes their measured sections, which hold the real nights' decode speeds and the
efficiency fitted from the predictions the recorder wrote beside them.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_gate_job import TOKEN, Service, run_service

from harness.commands.calibrate import calibrate_command
from harness.plugin.required import skip_unless_present
from harness.probes.docker_engine import engine_unavailable
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs
from harness.probes.hardware import detect_hardware

# In the parallel group: it judges no speed (the figures are only stored and read back).
# It ran alone while each llvmpipe server spent about 40 s of both cores compiling
# shaders, which starved a browser test beside it; with the drivers' shader cache
# (harness/runners/driver_cache.py) such a server starts in about a second.
pytestmark = [pytest.mark.server]

ROOT = Path(__file__).resolve().parent.parent
NIGHTLY = ROOT / "ci" / "scripts" / "nightly.sh"
#: One fixture: on llvmpipe every measured server costs about 40 s.
SELECTION = "test_fixture_serves and dense"


#: One cell per path: a bundle of its own, so each path's nights keep their own history.
CELLS = {"cpu": "fused-dense", "vulkan": "fused-mtp"}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[Service]:
    yield from run_service(tmp_path)


def _night(service: Service, tmp: Path, backend: str, night: int) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HARNESS_", "GITHUB_", "CI_", "PYTEST_"))}
    if "HARNESS_CACHE" in os.environ:
        env["HARNESS_CACHE"] = os.environ["HARNESS_CACHE"]
    env.update({
        "HARNESS_GATE_RUNNER": "subprocess" if backend == "cpu" else "container",
        "HARNESS_GATE_BASE": "local", "HARNESS_GATE_OUT": str(tmp / f"{backend}-{night}"),
        "HARNESS_GATE_SUMMARY": str(tmp / f"{backend}-{night}.md"),
        "HARNESS_GATE_WORKERS": "0", "HARNESS_GATE_REQUIRE_GPU": "0",
        "HARNESS_SERVICE_URL": service.url, "HARNESS_SERVICE_TOKEN": TOKEN,
        "HARNESS_RUN_ID": f"{backend}-night-{night}", "HARNESS_COMMIT": f"night-{night}",
    })
    done = subprocess.run([str(NIGHTLY), backend, CELLS[backend], "all", "-k", SELECTION],
                          env=env, capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"


def _test_cards(folder: Path) -> Path:
    shutil.copytree(GPU_CONFIG_DIR, folder)
    base = json.loads((folder / "rtx-4090.json").read_text())
    for name, pattern in (("this-cpu", re.escape(detect_hardware().cpu)),
                          ("this-llvmpipe", r"llvmpipe")):
        card = {**base, "name": name, "match": [pattern],
                "description": f"A test card: this machine's {name[5:]} runner."}
        (folder / f"{name}.json").write_text(json.dumps(card, indent=2) + "\n")
    return folder


def test_two_nights_per_path_become_measured_card_figures(service: Service,
                                                          tmp_path: Path) -> None:
    backends = ["cpu"]
    docker = engine_unavailable()
    if docker is None:
        backends.append("vulkan")
    for backend in backends:
        for night in (1, 2):
            _night(service, tmp_path, backend, night)
    folder = _test_cards(tmp_path / "gpu")
    done = CliRunner().invoke(calibrate_command, [
        "--service", service.url, "--branch", "nightly/", "--configs", str(folder),
        "--min-runs", "2", "--write"])
    assert done.exit_code == 0, done.output
    cards = {c.name: c for c in load_gpu_configs(folder)}
    for backend, card in (("cpu", "this-cpu"), ("vulkan", "this-llvmpipe")):
        if backend not in backends:
            continue
        measured = json.loads((folder / f"{card}.json").read_text())["measured"]
        entries = [entry for keys in measured.values() for entry in keys.values()]
        assert entries, f"{card}: nothing measured"
        assert all(e["runs"] == 2 and e["run_ids"] == [f"{backend}-night-1",
                                                        f"{backend}-night-2"]
                   for e in entries)
        assert all(e["decode_tps"]["median"] > 0 for e in entries)
        assert cards[card].measured_decode, "the loader reads the section back"
    cpu = json.loads((folder / "this-cpu.json").read_text())["measured"]
    # On the CPU path the recorder predicted every decode speed (llvmpipe has no card
    # config, so the Vulkan nights carry none): the fitted efficiency comes from those.
    assert all("decode_efficiency" in entry for keys in cpu.values() for entry in keys.values())
    # The CPU path passed; the Vulkan path needs a Docker engine (CI has one).
    skip_unless_present("docker", docker)
