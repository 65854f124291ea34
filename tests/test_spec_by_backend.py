"""A card's speculative settings per build backend (``spec_by_backend``), read, layered
and planned; the real server's side is suites/test_plan_forwarding.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness import modelgen
from harness.errors import ConfigError
from harness.facts.build import Backend, Capabilities
from harness.facts.gpu import DraftSampling, GpuConfig, GpuInfo
from harness.planning.autotune import Origin, autotune
from harness.planning.draft_sampling import sampling_left_out
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs

XTX = GpuInfo("AMD Radeon RX 7900 XTX", 24560)
#: The RX 7900 XTX drafts less and samples its drafts on ROCm, and not at all on Vulkan.
BY_BACKEND: dict[str, dict[str, object]] = {
    "rocm": {"spec_draft_n_max": 8, "spec_draft_sampling": "probabilistic"},
    "vulkan": {"spec_type": "none"}}


def _cards(folder: Path, spec_by_backend: object, card: str = "rx-7900-xtx"
           ) -> tuple[GpuConfig, ...]:
    shutil.copytree(GPU_CONFIG_DIR, folder, dirs_exist_ok=True)
    path = folder / f"{card}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "spec_by_backend": spec_by_backend}))
    return load_gpu_configs(folder)


def test_each_backend_gets_its_own_entry_over_the_card(tmp_path: Path) -> None:
    cards = _cards(tmp_path, BY_BACKEND)
    rocm = autotune(XTX, cards, None, {}, {}, backend=Backend.ROCM)
    assert rocm.settings.spec_draft_n_max == 8
    assert rocm.settings.spec_draft_sampling is DraftSampling.PROBABILISTIC
    assert rocm.origins["spec_draft_n_max"] is Origin.CARD_BACKEND
    assert rocm.origins["spec_draft_n_min"] is Origin.CARD
    assert any("rx-7900-xtx for rocm builds sets" in r for r in rocm.reasons)
    for other in (Backend.VULKAN, None):
        plain = autotune(XTX, cards, None, {}, {}, backend=other)
        assert plain.settings.spec_draft_n_max == 16
        assert plain.origins["spec_draft_n_max"] is Origin.CARD
        assert plain.settings.spec_draft_sampling is None


def test_a_later_layer_still_wins_over_the_backend_entry(tmp_path: Path) -> None:
    cards = _cards(tmp_path, BY_BACKEND)
    tuned = autotune(XTX, cards, None, {"spec_draft_n_max": 3},
                     {"HARNESS_LLAMA_SPEC_DRAFT_SAMPLING": "greedy"}, backend=Backend.ROCM)
    assert (tuned.settings.spec_draft_n_max, tuned.origins["spec_draft_n_max"]) == (
        3, Origin.CALL)
    assert tuned.settings.spec_draft_sampling is DraftSampling.GREEDY


@pytest.mark.parametrize(("entry", "message"), [
    pytest.param({"cuda": {"spec_draft_n_max": 8}}, "$.spec_by_backend.cuda",
                 id="a-backend-the-card-has-not"),
    pytest.param({"rocm": {"spec_draft_n_min": 20}}, "larger than spec_draft_n_max 16",
                 id="n-min-over-the-cards-n-max"),
    pytest.param({"rocm": {"spec_draft_sampling": "sometimes"}}, "sometimes",
                 id="unknown-sampling"),
    pytest.param({"rocm": {}}, "$.spec_by_backend.rocm", id="empty-entry"),
    pytest.param({"metal": {"spec_type": "none"}}, "metal", id="unknown-backend"),
])
def test_a_bad_entry_is_named_with_what_is_allowed(entry: object, message: str,
                                                  tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as raised:
        _cards(tmp_path, entry)
    assert message in str(raised.value)
    assert "rx-7900-xtx.json" in str(raised.value)


def _plan(cards: tuple[GpuConfig, ...], backend: Backend, **changes: object
          ) -> tuple[list[str], tuple[str, ...], str | None]:
    fixtures = modelgen.ensure_fixtures()
    model = fixtures.model("dense")
    request = PlanRequest(model_path=model, model=read_model_facts(model), gpu=XTX,
                          configs=cards, backend=backend,
                          explicit_drafter=fixtures.model("drafter"),
                          per_call={"ctx_size": 512, "parallel": 1}, **changes)  # type: ignore[arg-type]
    plan = plan_launch(request)
    return plan.to_argv("llama-server", "127.0.0.1", 0), plan.reasons, plan.spec.spec_type


def test_the_backend_entry_decides_drafting_and_its_sampling(tmp_path: Path) -> None:
    cards = _cards(tmp_path, {**BY_BACKEND, "rocm": {**BY_BACKEND["rocm"],
                                                     "spec_type": "draft-simple"}})
    argv, reasons, spec_type = _plan(cards, Backend.ROCM)
    assert spec_type == "draft-simple"
    assert "spec type draft-simple (from rx-7900-xtx for this backend)" in reasons
    assert argv[argv.index("--spec-draft-sampling") + 1] == "probabilistic"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "8"
    argv, reasons, spec_type = _plan(cards, Backend.VULKAN)
    assert spec_type is None
    assert "--spec-draft-sampling" not in argv
    # An explicit spec type still wins over the card's.
    _, _, spec_type = _plan(cards, Backend.VULKAN, explicit_spec_type="draft-simple")
    assert spec_type == "draft-simple"


def test_sampling_is_sent_only_where_a_drafter_samples() -> None:
    known = Capabilities(flags=("--spec-draft-sampling", "--spec-type"))
    old = Capabilities(flags=("--spec-type",))
    assert sampling_left_out(None, "draft-simple", known) is None
    assert sampling_left_out(DraftSampling.PROBABILISTIC, "draft-mtp", known) is None
    left = sampling_left_out(DraftSampling.GREEDY, None, known)
    assert left is not None
    assert "spec type none" in left
    assert "ngram-simple" in str(sampling_left_out(DraftSampling.GREEDY, "ngram-simple", known))
    # An older build drafts greedily only: greedy is left out, probabilistic is not (the
    # plan then reports it as not supported by that build).
    assert "has no --spec-draft-sampling" in str(
        sampling_left_out(DraftSampling.GREEDY, "draft-simple", old))
    assert sampling_left_out(DraftSampling.PROBABILISTIC, "draft-simple", old) is None


def test_probabilistic_sampling_on_a_build_without_it_is_not_sendable(tmp_path: Path) -> None:
    cards = _cards(tmp_path, {"rocm": {"spec_type": "draft-simple",
                                       "spec_draft_sampling": "probabilistic"}})
    fixtures = modelgen.ensure_fixtures()
    model = fixtures.model("dense")
    plan = plan_launch(PlanRequest(
        model_path=model, model=read_model_facts(model), gpu=XTX, configs=cards,
        backend=Backend.ROCM, explicit_drafter=fixtures.model("drafter"),
        per_call={"ctx_size": 512, "parallel": 1},
        capabilities=Capabilities(flags=("--spec-type", "--spec-draft-model",
                                         "--ctx-size"))))
    assert "--spec-draft-sampling" in plan.unsupported
