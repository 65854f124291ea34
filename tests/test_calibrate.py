"""``harness calibrate`` against a real results service holding several nightly runs.

The card configs are the packaged ones plus a test card whose ``match`` finds what this
machine reports (its CPU model: a CPU runner has no GPU name). Four nights of one cell
ran here, one night ran on an RTX 4090, and a pull-request branch ran too; calibrate
reads them over HTTP, maps each run to its card, prints the table and writes the test
card's measured section, which the config loader then accepts.
"""

from __future__ import annotations

import json
import re
import shutil
import statistics
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner
from results_fixtures import at, fig, make_run
from service_helpers import no_report

from harness.commands.calibrate import calibrate_command, write_measured
from harness.planning.decode_speed import HOST_EFFICIENCY
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs
from harness.probes.hardware import detect_hardware
from harness.results.calibration import PROVENANCE, calibrate, key_label
from harness.results.comparison import compare
from harness.results.comparison_render import comparison_json, comparison_markdown
from harness.results.noise_rule import DEFAULT_NOISE_RULE
from harness.results.run_record import Hardware, RunRecord
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.settings import ServiceSettings

CELL = "nightly/fused-dense/this-runner"
DECODE = [100.0, 104.0, 96.0, 102.0]
TTFT = [20.0, 22.0, 21.0, 40.0]
RTX_4090 = Hardware(host="gpu-1", cpu="x", gpu="NVIDIA GeForce RTX 4090", vram_mib=24564)


def _here() -> Hardware:
    return detect_hardware()


def _test_card(folder: Path) -> Path:
    """A copy of the packaged configs with ``this-runner``, matching this machine's CPU."""
    shutil.copytree(GPU_CONFIG_DIR, folder)
    card = json.loads((folder / "rtx-4090.json").read_text())
    card.update(name="this-runner", match=[re.escape(_here().cpu)],
                description="A test card: this CI machine, matched by its CPU model.")
    (folder / "this-runner.json").write_text(json.dumps(card, indent=2) + "\n")
    return folder


def _runs() -> list[RunRecord]:
    here = _here()
    nights = [make_run(f"night-{i}", branch=CELL, started_at=at(i), hardware=here,
                       figures=[replace(fig("decode_tps", d), predicted=125.0),
                                fig("ttft_ms", t)])
              for i, (d, t) in enumerate(zip(DECODE, TTFT, strict=True))]
    gpu_night = make_run("gpu-night", branch="nightly/fused-dense/rtx-4090",
                         started_at=at(10), hardware=RTX_4090,
                         figures=[fig("decode_tps", 140.0)])
    pull = make_run("pr-run", branch="pr/7", started_at=at(11), hardware=here,
                    figures=[fig("decode_tps", 1.0)])
    return [*nights, gpu_night, pull]


def test_runs_are_grouped_by_card_and_figure_with_medians_and_percentiles(
        tmp_path: Path) -> None:
    cards = load_gpu_configs(_test_card(tmp_path / "gpu"))
    rows = {(r.card, r.metric): r for r in calibrate(_runs()[:5], cards)}
    decode = rows[("this-runner", "decode_tps")]
    assert decode.measured == statistics.median(DECODE)
    assert decode.runs == 4
    # Quartiles of 96, 100, 102, 104 (inclusive): 99 and 102.5.
    assert decode.spread == pytest.approx((102.5 - 99.0) / 101.0)
    assert rows[("this-runner", "ttft_p50_ms")].measured == 21.5
    assert rows[("this-runner", "ttft_p95_ms")].measured == pytest.approx(37.3)
    assert rows[("this-runner", "decode_efficiency")].measured == pytest.approx(
        HOST_EFFICIENCY * statistics.median(d / 125.0 for d in DECODE))
    gpu = rows[("rtx-4090", "decode_tps")]
    assert (gpu.runs, gpu.extrapolated) == (1, 140)
    assert gpu.change == 0.0


def test_calibrate_reads_the_service_and_writes_a_valid_measured_section(
        tmp_path: Path) -> None:
    folder = _test_card(tmp_path / "gpu")
    before_4090 = (folder / "rtx-4090.json").read_bytes()
    url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(url) as store:
        for run in _runs():
            assert store.add_run(run)
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token="t" * 32,
                                     results_url=url, report_generator=no_report))
    args = ["--branch", "nightly/", "--configs", str(folder), "--min-runs", "3", "--write"]
    with serve_in_thread(app) as base:
        done = CliRunner().invoke(calibrate_command, ["--service", base, *args])
        assert done.exit_code == 0, done.output
        first = (folder / "this-runner.json").read_bytes()
        again = CliRunner().invoke(calibrate_command, ["--service", base, *args])
        assert again.exit_code == 0, again.output
    output = " ".join(done.output.split())
    assert "5 runs of nightly/; 2 cards matched" in output
    assert "wrote" in output
    assert "left" in output
    assert "(every group under 3 runs)" in output
    assert (folder / "this-runner.json").read_bytes() == first, "a rewrite is stable"
    assert (folder / "rtx-4090.json").read_bytes() == before_4090, "1 night < --min-runs"

    written = json.loads(first)
    entry = written["measured"]["tiny-llama"][key_label(fig("decode_tps", 0).key)]
    assert entry["_provenance"] == PROVENANCE
    assert entry["runs"] == 4
    assert entry["run_ids"] == [f"night-{i}" for i in range(4)]
    assert (entry["first"], entry["last"]) == (at(0), at(3))
    assert entry["harness_versions"] == ["0.1.0"]
    assert entry["decode_tps"]["median"] == statistics.median(DECODE)
    assert {"ttft_p50_ms", "ttft_p95_ms", "decode_efficiency"} <= set(entry)
    assert written["expected_metrics"]["_provenance"] == "extrapolated", "left as it was"
    assert {c.name for c in load_gpu_configs(folder)} >= {"this-runner", "rtx-4090"}


def test_an_unreachable_service_is_one_clear_error(tmp_path: Path) -> None:
    done = CliRunner().invoke(calibrate_command, ["--service", "http://127.0.0.1:9",
                                                  "--branch", "nightly/"])
    assert done.exit_code == 1
    assert "cannot reach the results service at http://127.0.0.1:9" in done.output
    assert "check --service" in done.output
    assert "Traceback" not in done.output


def test_a_later_night_past_the_calibrated_spread_is_reported_as_drift(tmp_path: Path) -> None:
    folder = _test_card(tmp_path / "gpu")
    rows = [r for r in calibrate(_runs()[:4], load_gpu_configs(folder))]
    assert write_measured(folder / "this-runner.json", rows, 3) == 1
    cards = load_gpu_configs(folder)
    nights = _runs()[:4]

    def later(decode: float) -> RunRecord:
        return make_run("later", branch=CELL, started_at=at(20), hardware=_here(),
                        figures=[fig("decode_tps", decode), fig("ttft_ms", 21.0)])

    steady = compare(list(reversed(nights)), later(102.0), DEFAULT_NOISE_RULE, cards)
    assert steady.drift == ()
    slower = compare(list(reversed(nights)), later(80.0), DEFAULT_NOISE_RULE, cards)
    (drift,) = slower.drift
    assert (drift.card, drift.measured.median, drift.current) == ("this-runner", 101.0, 80.0)
    assert drift.measured.runs == 4
    assert comparison_json(slower)["drift"][0]["change"] == pytest.approx(80.0 / 101.0 - 1)
    markdown = comparison_markdown(slower)
    assert "### Drift from the card's measured figures (1)" in markdown
    assert "| this-runner |" in markdown
    assert "101 ± 3.5 % (4, last" in markdown
