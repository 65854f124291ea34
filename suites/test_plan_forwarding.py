"""Plan forwarding: every planned field reaches the running server intact.

Each plan is launched through the dispatcher and held against what the server itself
reports — ``/props`` (``total_slots``, ``default_generation_settings.n_ctx``), ``/slots``,
and the startup log (context, batch, ubatch, flash attention, K/V types, the KV cache
line to the printed decimals, drafter, tensor overrides, the draft sizes, context
checkpoints, the load mode and what the load did, and on GPU builds the offloaded layers,
the devices the model was split over and where the KV cache went) — never against the
argv we sent. A mismatch names the field, the planned value and the observed value.

``/props`` and ``/slots`` carry none of the draft sizes in the pinned server
(``get_res_props`` reports a default ``task_params``, ``/slots`` only ``speculative``), so
the log's ``- n_max=…, n_min=…, p_min=…`` line is their one witness. A planned field the
build cannot show (``harness.verdicts.unverifiable_fields.unverifiable``: the GPU fields on
the CPU build, draft sizes without a drafter, …) is left out of the comparison, never silently: it
is attached to the test's report as "unverified fields", and the run's terminal summary
says once per field and reason how many tests left it out.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import allure
import pytest

from harness import modelgen
from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.facts.gpu import GpuInfo
from harness.planning.kv import AUTO_PARALLEL
from harness.planning.launch_plan import LaunchPlan
from harness.planning.release_rules import NOT_MODELLED
from harness.plugin import LaunchPlanned, PlanFor, RecordUnverified
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs
from harness.verdicts.kv_log import KvLogLine, check_kv_plan
from harness.verdicts.launch_report import parse_launch_log
from harness.verdicts.plan_check import compare_launch
from harness.verdicts.unverifiable_fields import unverifiable

pytestmark = pytest.mark.server

#: Fields of a plan the startup log can confirm (harness.verdicts.plan_check): every field
#: ``harness plan`` prints.
FORWARDED = ("ctx_size", "parallel", "batch_size", "ubatch_size", "cache_type_k",
             "cache_type_v", "flash_attn", "drafter", "spec_type", "n_cpu_moe", "cpu_moe",
             "n_cpu_ffn", "n_gpu_layers", "split_mode", "main_gpu", "kv_offload", "load_mode",
             "ctx_checkpoints", "checkpoint_min_step", "spec_draft_n_min", "spec_draft_n_max",
             "spec_draft_p_min", "spec_draft_sampling")


#: (id, fixture, per-call settings, extra PlanRequest fields)
MATRIX: list[tuple[str, str, dict[str, object], dict[str, object]]] = [
    ("dense-defaults", "dense", {}, {}),
    # No -c with 2 slots: the fit step gives each its own training context (the pin).
    ("dense-np2-unset-ctx", "dense", {"parallel": 2}, {}),
    ("dense-ctx1024-np2", "dense", {"ctx_size": 1024, "parallel": 2}, {}),
    ("dense-ctx768-np3", "dense", {"ctx_size": 768, "parallel": 3}, {}),
    ("dense-batch256-ubatch64", "dense", {"ctx_size": 512, "batch_size": 256,
                                          "ubatch_size": 64}, {}),
    ("dense-f32-k", "dense", {"ctx_size": 512, "cache_type_k": "f32"}, {}),
    ("dense-fa-off", "dense", {"ctx_size": 512, "flash_attn": "off"}, {}),
    ("dense-fa-on", "dense", {"ctx_size": 512, "flash_attn": "on"}, {}),
    ("swa-ctx2048-np2", "swa", {"ctx_size": 2048, "parallel": 2}, {}),
    ("mtp-q8_0-fa-on", "mtp", {"ctx_size": 1024, "cache_type_k": "q8_0",
                               "cache_type_v": "q8_0", "flash_attn": "on"},
     {"explicit_spec_type": "none"}),
    ("mtp-q8_0-k-q4_0-v", "mtp", {"ctx_size": 2048, "parallel": 2, "cache_type_k": "q8_0",
                                  "cache_type_v": "q4_0", "flash_attn": "on"},
     {"explicit_spec_type": "none"}),
    ("mtp-draft-mtp", "mtp", {"ctx_size": 1024}, {}),
    ("dense-drafter-on", "dense", {"ctx_size": 512, "parallel": 1},
     {"explicit_spec_type": "draft-simple"}),
    ("dense-drafter-off", "dense", {"ctx_size": 512, "parallel": 1},
     {"explicit_spec_type": "none"}),
    # draft-simple prints the sizes with %f, draft-mtp with %.2f (0.125 is printed 0.12).
    ("dense-drafter-sizes", "dense", {"ctx_size": 512, "parallel": 1, "spec_draft_n_min": 2,
                                      "spec_draft_n_max": 5, "spec_draft_p_min": 0.75},
     {"explicit_spec_type": "draft-simple"}),
    ("mtp-draft-mtp-sizes", "mtp", {"ctx_size": 1024, "spec_draft_n_min": 1,
                                    "spec_draft_n_max": 4, "spec_draft_p_min": 0.125}, {}),
    ("dense-checkpoints", "dense", {"ctx_size": 512, "ctx_checkpoints": 5,
                                    "checkpoint_min_step": 64}, {}),
    ("dense-checkpoints-off", "dense", {"ctx_size": 512, "ctx_checkpoints": 0}, {}),
    # gemma4's per-layer embeddings: read lazily under --lazy-mode on, resident under off
    # and under auto (the default: only tensors over 4 GiB), whatever the load mode.
    ("ple-lazy-on", "ple", {"ctx_size": 512, "lazy_mode": "on"}, {}),
    ("ple-lazy-on-load-none", "ple", {"ctx_size": 512, "lazy_mode": "on", "load_mode": "none"},
     {}),
    ("ple-lazy-off", "ple", {"ctx_size": 512, "lazy_mode": "off"}, {}),
    ("ple-lazy-default", "ple", {"ctx_size": 512}, {}),
    ("dense-load-none", "dense", {"ctx_size": 512, "load_mode": "none"}, {}),
    ("dense-load-mlock", "dense", {"ctx_size": 512, "load_mode": "mlock"}, {}),
    ("dense-load-mmap-mlock", "dense", {"ctx_size": 512, "load_mode": "mmap+mlock"}, {}),
    # GPU fields: checked on GPU builds, reported unverified on the CPU build.
    ("dense-no-kv-offload", "dense", {"ctx_size": 512, "kv_offload": False}, {}),
    ("dense-split-none-main-gpu-0", "dense", {"ctx_size": 512, "split_mode": "none",
                                              "main_gpu": 0}, {}),
    ("dense-ngl-2", "dense", {"ctx_size": 512, "n_gpu_layers": 2}, {}),
]

#: Device names each card config's pattern matches, as the driver reports them.
CARD_DEVICE_NAMES = {
    "rtx-3090": "NVIDIA GeForce RTX 3090",
    "rtx-4090": "NVIDIA GeForce RTX 4090",
    "rtx-5090": "NVIDIA GeForce RTX 5090",
    "h200": "NVIDIA H200",
    "mi300x": "AMD Instinct MI300X",
    "rx-7900-xtx": "AMD Radeon RX 7900 XTX",
    "arc-a770": "Intel(R) Arc(TM) A770 Graphics",
}


def _assert_forwarded(plan: LaunchPlan, launch: LaunchPlanned, harness_build: BuildUnderTest,
                      unverified_fields: RecordUnverified) -> None:
    server = launch(plan)
    with ServerClient(server.base_url) as client:
        props = client.props()
        slots = client.slots()
    report = parse_launch_log(server.log_text())
    expected: dict[str, object] = {name: getattr(plan.spec, name) for name in FORWARDED}
    expected["cpu_moe"] = plan.spec.cpu_moe or None  # False: not planned, nothing to check
    # --lazy-mode is checked by what it does: the tensors the loader read lazily.
    expected["lazy_tensors"] = plan.lazy.tensors if plan.lazy is not None else None
    # A projector: loaded, where the plan put it, as large as its budget.
    vision = plan.vision
    expected["mmproj"] = vision.projector if vision else None
    expected["projector_on_gpu"] = vision.on_gpu if vision else None
    expected["projector_bytes"] = vision.projector_bytes if vision else None
    unseen = unverifiable(expected, harness_build.backend)
    _say_unverified(unseen, expected, harness_build, unverified_fields)
    checked = {name: value for name, value in expected.items() if name not in unseen}
    problems = [str(m) for m in compare_launch(checked, report)]
    planned_slots = plan.spec.parallel or AUTO_PARALLEL
    if props.total_slots != planned_slots:
        problems.append(f"/props total_slots: planned {planned_slots}, "
                        f"observed {props.total_slots}")
    if len(slots) != planned_slots:
        problems.append(f"/slots: planned {planned_slots} slots, observed {len(slots)}")
    if props.n_ctx != report.n_ctx_slot:
        problems.append(f"/props n_ctx: the log's slot context is {report.n_ctx_slot}, "
                        f"/props says {props.n_ctx}")
    if plan.kv is not None:
        caches = report.kv_caches[: len(plan.kv.caches)]
        if (kv := check_kv_plan(plan.kv, caches)) is not None:
            problems.append(f"KV cache: {kv}")
    assert not problems, "the server does not report the plan:\n" + "\n".join(problems)
    _say_not_modelled(plan, report.kv_caches)


def _say_not_modelled(plan: LaunchPlan, observed: tuple[KvLogLine, ...]) -> None:
    """A build whose release the KV model cannot place (planning/release_rules.py) has no
    planned KV to check: the test says so with what the server did, as its own finding,
    rather than passing on the fields it could check."""
    unplaced = [w.message for w in plan.warnings if w.code == NOT_MODELLED]
    if unplaced:
        seen = "; ".join(f"{line.role.value} cache {line.cells} cells x {line.layers} layers"
                         for line in observed) or "no KV cache line"
        pytest.fail(f"{unplaced[0]}; observed: {seen}", pytrace=False)


def _say_unverified(unseen: dict[str, str], expected: dict[str, object],
                    harness_build: BuildUnderTest, record: RecordUnverified) -> None:
    """Name every planned field left unchecked: each value and reason in the test's report,
    and each field once in the run's summary (harness/plugin/unverified.py)."""
    if not unseen:
        return
    fields = {name: {"planned": repr(expected[name]), "why": why}
              for name, why in sorted(unseen.items())}
    allure.attach(json.dumps({"backend": harness_build.backend.value, "fields": fields},
                             indent=2), "unverified fields", allure.attachment_type.JSON)
    record(unseen)


@pytest.mark.parametrize(("fixture", "per_call", "extra"),
                         [pytest.param(f, c, e, id=i) for i, f, c, e in MATRIX])
def test_plan_reaches_the_server(*, fixture: str, per_call: dict[str, object],
                                 extra: dict[str, object], plan_for: PlanFor,
                                 launch: LaunchPlanned, harness_build: BuildUnderTest,
                                 fixture_set: modelgen.FixtureSet,
                                 unverified_fields: RecordUnverified) -> None:
    if extra.get("explicit_spec_type") == "draft-simple":
        extra = {**extra, "explicit_drafter": fixture_set.model("drafter")}
    plan = plan_for(model=fixture, per_call=per_call, **extra)
    _assert_forwarded(plan, launch, harness_build, unverified_fields)


def test_bundle_plan_reaches_the_server(any_bundle: str, plan_for: PlanFor,
                                        launch: LaunchPlanned, harness_build: BuildUnderTest,
                                        unverified_fields: RecordUnverified) -> None:
    """Every bundle: the fixtures' and the user's (``--harness-bundles``)."""
    _assert_forwarded(plan_for(bundle=any_bundle), launch, harness_build, unverified_fields)


def test_planned_offload_reaches_the_server(plan_for: PlanFor, launch: LaunchPlanned,
                                            harness_build: BuildUnderTest,
                                            unverified_fields: RecordUnverified) -> None:
    plan = plan_for(model="moe", per_call={"ctx_size": 512})
    # The fixture fits any GPU, so the offload is set as a per-call rung would set it; the
    # log proves which blocks moved at -lv 5.
    spec = dataclasses.replace(plan.spec, n_cpu_moe=1, log_verbosity=5)
    _assert_forwarded(dataclasses.replace(plan, spec=spec), launch, harness_build,
                      unverified_fields)


@pytest.mark.parametrize("card", sorted(CARD_DEVICE_NAMES))
def test_card_flag_set_scaled_to_the_fixture(card: str, plan_for: PlanFor,
                                             launch: LaunchPlanned,
                                             harness_build: BuildUnderTest,
                                             unverified_fields: RecordUnverified) -> None:
    config = next(c for c in load_gpu_configs() if c.name == card)
    gpu = GpuInfo(CARD_DEVICE_NAMES[card], config.vram_mib)
    # The card's own parallel, batch, cache types, flash-attn and checkpoints; only the
    # context shrinks to the tiny fixture (512 tokens a slot). The mtp fixture's head width
    # (32) takes the quantized cache types a fork type falls back to on a stock build.
    parallel = config.llama_server_flags.parallel or 1
    plan = plan_for(model="mtp", gpu=gpu, per_call={"ctx_size": 512 * parallel},
                    explicit_spec_type="none")
    assert plan.tune.label == card
    assert plan.origins["parallel"] == "card"
    _assert_forwarded(plan, launch, harness_build, unverified_fields)


def _cards_with(folder: Path, card: str, spec_by_backend: dict[str, object]) -> Path:
    """The packaged cards, copied into ``folder`` with ``card`` given ``spec_by_backend``."""
    shutil.copytree(GPU_CONFIG_DIR, folder, dirs_exist_ok=True)
    path = folder / f"{card}.json"
    path.write_text(json.dumps({**json.loads(path.read_text()),
                                "spec_by_backend": spec_by_backend}, indent=2))
    return folder


def test_a_cards_draft_settings_for_the_builds_backend_reach_the_server(
        *, plan_for: PlanFor, launch: LaunchPlanned, harness_build: BuildUnderTest,
        fixture_set: modelgen.FixtureSet, unverified_fields: RecordUnverified,
        tmp_path: Path) -> None:
    """A card's ``spec_by_backend`` entry for the build's own backend (``spec.byBackend`` of
    reference 002, docs/references.md) lies over the card's draft settings: drafting on,
    sizes of its own."""
    folder = _cards_with(tmp_path / "cards", "rtx-4090", {harness_build.backend.value: {
        "spec_type": "draft-simple", "spec_draft_n_min": 2, "spec_draft_n_max": 5,
        "spec_draft_sampling": "greedy"}})
    plan = plan_for(model="dense", gpu=GpuInfo(CARD_DEVICE_NAMES["rtx-4090"], 24564),
                    configs=load_gpu_configs(folder),
                    explicit_drafter=fixture_set.model("drafter"),
                    per_call={"ctx_size": 512, "parallel": 1, "cache_type_k": "f16",
                              "cache_type_v": "f16"})
    assert plan.spec.spec_type == "draft-simple", plan.reasons
    assert any("from rtx-4090 for this backend" in r for r in plan.reasons), plan.reasons
    assert (plan.spec.spec_draft_n_max, plan.origins["spec_draft_n_max"]) == (5,
                                                                             "card-backend")
    assert plan.spec.spec_draft_sampling == "greedy"
    assert "--spec-draft-sampling" in plan.to_argv("llama-server", "127.0.0.1", 0)
    _assert_forwarded(plan, launch, harness_build, unverified_fields)


@pytest.mark.parametrize(("gpu", "keep_off_gpu"), [
    pytest.param(None, False, id="no-gpu"),
    pytest.param(GpuInfo(CARD_DEVICE_NAMES["rtx-4090"], 24564), False, id="rtx-4090"),
    pytest.param(GpuInfo(CARD_DEVICE_NAMES["rtx-4090"], 24564), True,
                 id="rtx-4090-no-mmproj-offload"),
])
def test_a_planned_projector_loads_where_and_as_large_as_planned(
        *, gpu: GpuInfo | None, keep_off_gpu: bool, plan_for: PlanFor,
        launch: LaunchPlanned, harness_build: BuildUnderTest,
        fixture_set: modelgen.FixtureSet, unverified_fields: RecordUnverified) -> None:
    """The vision budget (reference 002's ``mmprojBudgetBytes``, docs/references.md): the
    projector's bytes on the GPU beside the weights, or on the host, checked against the
    loader's ``CLIP using <backend> backend`` and ``model size`` lines."""
    projector = fixture_set.projector("dense-mmproj")
    plan = plan_for(model="dense", gpu=gpu, projector=projector,
                    keep_projector_off_gpu=keep_off_gpu,
                    per_call={"ctx_size": 512, "parallel": 1, "batch_size": 512,
                              "cache_type_k": "f16", "cache_type_v": "f16"})
    assert plan.vision is not None
    assert plan.vision.projector_bytes == projector.stat().st_size
    assert plan.vision.on_gpu is (gpu is not None and not keep_off_gpu)
    assert plan.spec.no_mmproj_offload is keep_off_gpu
    _assert_forwarded(plan, launch, harness_build, unverified_fields)
