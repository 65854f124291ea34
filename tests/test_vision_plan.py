"""The vision projector: its fixture, its plan and budget, how the log reports it, and a
projector that does not load. The real server's side is suites/test_vision.py and the
projector cases of suites/test_plan_forwarding.py."""

from __future__ import annotations

import json
import struct
import zlib
from decimal import Decimal
from pathlib import Path

import gguf
import pytest

from harness import modelgen
from harness.errors import FixtureError
from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo
from harness.modelgen.projector import gradient_png, load_projector_specs
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.vision import plan_vision
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_gpu_configs
from harness.verdicts.failure import FIXES, FailureClass, classify_start_failure
from harness.verdicts.launch_report import parse_launch_log
from harness.verdicts.plan_check import compare_launch
from harness.verdicts.unverifiable_fields import unverifiable

#: The pinned build's lines for the dense-mmproj projector (measured), and for a cut one.
LOADED = """0.00.016.842 I clip_ctx: CLIP using CPU backend
0.00.017.112 I load_hparams: model size:         0.11 MiB
0.00.017.113 I load_hparams: metadata size:      0.01 MiB
0.00.018.657 I srv    load_model: loaded multimodal model, '/f/dense-mmproj.gguf'
"""
BROKEN = """0.00.222.681 E clip_init: failed to load model '/t/cut.gguf': load_tensors: \
failed to seek for tensor v.pre_ln.weight
0.00.222.730 E mtmd_init_from_file: error: Failed to load CLIP model from /t/cut.gguf
0.00.222.732 E srv    load_model: failed to load multimodal model, '/t/cut.gguf'
0.00.223.086 E srv  llama_server: exiting due to model loading error
"""
XTX = GpuInfo("AMD Radeon RX 7900 XTX", 24560)


def test_the_projector_fits_its_model_and_is_written_deterministically() -> None:
    fixtures = modelgen.ensure_fixtures()
    path = fixtures.projector("dense-mmproj")
    recorded = modelgen.read_recorded_hashes()
    assert "projectors/dense-mmproj.gguf" in recorded
    reader = gguf.GGUFReader(path)
    dims = {str(f.name): int(f.parts[-1][0]) for f in reader.fields.values()
            if f.name.startswith("clip.vision.") and f.types and len(f.parts[-1]) == 1}
    assert dims["clip.vision.projection_dim"] == read_model_facts(
        fixtures.model("dense")).embedding_length


def test_a_projector_spec_naming_no_fixture_or_a_ragged_image_is_refused(
        tmp_path: Path) -> None:
    base = json.loads((modelgen.fixture_spec_dir() / "projectors" / "dense-mmproj.json")
                      .read_text())
    (tmp_path / "a.json").write_text(json.dumps({**base, "fits": "nothing"}))
    with pytest.raises(FixtureError, match=r"a\.json: \$\.fits: \"nothing\" is not allowed"):
        load_projector_specs(tmp_path, ("dense",))
    (tmp_path / "a.json").write_text(json.dumps({**base, "image_size": 30}))
    with pytest.raises(FixtureError, match=r"image_size: 30 is not allowed: not a multiple"):
        load_projector_specs(tmp_path, ("dense",))


def test_the_test_image_is_a_png_of_its_size() -> None:
    png = gradient_png(32)
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    width, height = struct.unpack(">II", png[16:24])
    assert (width, height) == (32, 32)
    idat = png.index(b"IDAT")
    length = struct.unpack(">I", png[idat - 4:idat])[0]
    assert len(zlib.decompress(png[idat + 4:idat + 4 + length])) == 32 * (1 + 32 * 3)


@pytest.mark.parametrize(("gpu", "keep_off", "on_gpu"), [
    (False, False, False), (True, False, True), (True, True, False)])
def test_the_projector_goes_to_the_gpu_unless_there_is_none_or_it_is_kept_off(
        gpu: bool, keep_off: bool, on_gpu: bool) -> None:
    plan = plan_vision(Path("/p.gguf"), 1 << 20, gpu_planned=gpu, keep_off_gpu=keep_off)
    assert plan is not None
    assert plan.on_gpu is on_gpu
    assert plan.gpu_bytes == (1 << 20 if on_gpu else 0)
    assert plan_vision(None, 0, gpu_planned=gpu, keep_off_gpu=keep_off) is None


def test_the_plan_sends_the_projector_and_says_where_it_goes() -> None:
    fixtures = modelgen.ensure_fixtures()
    model, projector = fixtures.model("dense"), fixtures.projector("dense-mmproj")
    request = PlanRequest(model_path=model, model=read_model_facts(model), gpu=XTX,
                          configs=load_gpu_configs(),
                          projector=projector, projector_bytes=projector.stat().st_size,
                          keep_projector_off_gpu=True)
    plan = plan_launch(request)
    argv = plan.to_argv("llama-server", "127.0.0.1", 0)
    assert argv[argv.index("--mmproj") + 1] == str(projector)
    assert "--no-mmproj-offload" in argv
    assert plan.to_json()["vision"]["on_gpu"] is False
    assert any("on the host (--no-mmproj-offload)" in r for r in plan.reasons)


def test_the_log_reports_where_the_projector_is_and_its_size() -> None:
    report = parse_launch_log(LOADED)
    assert report.projector_path == "/f/dense-mmproj.gguf"
    assert report.projector_backend == "CPU"
    assert report.projector_mib == Decimal("0.12")
    planned = {"mmproj": Path("/f/dense-mmproj.gguf"), "projector_on_gpu": False,
               "projector_bytes": 123488}
    assert compare_launch(planned, report) == ()
    wrong = compare_launch({**planned, "projector_bytes": 1 << 20}, report)
    assert [m.field for m in wrong] == ["projector_bytes"]
    # A CPU build shows a projector planned on the GPU nowhere; one planned on the host,
    # it does.
    assert "projector_on_gpu" in unverifiable({**planned, "projector_on_gpu": True},
                                              Backend.CPU)
    assert "projector_on_gpu" not in unverifiable(planned, Backend.CPU)


def test_a_projector_that_does_not_load_is_its_own_failure_with_the_fix() -> None:
    failure = classify_start_failure(1, BROKEN, timed_out=False)
    assert failure.kind is FailureClass.PROJECTOR_LOAD
    assert "'/t/cut.gguf'" in failure.evidence
    assert "--mmproj" in FIXES[FailureClass.PROJECTOR_LOAD]
