"""Plans against the real server: what ``parse_launch_log`` reads back is what was planned.

Each case starts the pinned llama-server (``start_server``) with one ``LaunchSpec`` and
compares every planned field the log can show — context, slots, batch, ubatch, cache
types, flash attention, drafter, MTP context, MoE overrides, draft sizes, context
checkpoints, load mode — with ``compare_launch``, and shows that a plan with other values
for the draft sizes, checkpoints and load mode is caught by the same server's log.
The CPU build offloads nothing, so the GPU verdict must be ``no-gpu-expected``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import fields

import pytest

from harness import modelgen
from harness.planning.launch import LaunchSpec
from harness.plugin import StartServer
from harness.verdicts.gpu_use import GpuState, gpu_verdict
from harness.verdicts.launch_report import parse_launch_log
from harness.verdicts.plan_check import comparable_fields, compare_launch

pytestmark = pytest.mark.server

#: The LaunchSpec fields compare_launch knows: the plan values a log can confirm.
PLAN_FIELDS = tuple(f.name for f in fields(LaunchSpec) if f.name in comparable_fields())

Plan = Callable[[modelgen.FixtureSet], LaunchSpec]

PLANS: dict[str, Plan] = {
    "dense-two-slots-fa-off": lambda fx: LaunchSpec(
        model=fx.model("dense"), ctx_size=2048, parallel=2, batch_size=1024, ubatch_size=256,
        cache_type_k="f16", cache_type_v="f16", flash_attn="off"),
    # -c 1000 is padded to 1024 and split into 4 windows of 256; f32 K with flash attention.
    "dense-padded-ctx-fa-on": lambda fx: LaunchSpec(
        model=fx.model("dense"), ctx_size=1000, parallel=4, batch_size=256, ubatch_size=128,
        cache_type_k="f32", flash_attn="on"),
    "dense-with-drafter": lambda fx: LaunchSpec(
        model=fx.model("dense"), ctx_size=1024, parallel=1, flash_attn="auto",
        spec_type="draft-simple", drafter=fx.model("drafter")),
    # q8_0 V makes llama_init_from_model turn auto into enabled; the MTP context stays f16.
    "mtp-q8-cache": lambda fx: LaunchSpec(
        model=fx.model("mtp"), ctx_size=1024, parallel=1, cache_type_k="q8_0",
        cache_type_v="q8_0", flash_attn="auto", spec_type="draft-mtp"),
    # The overridden tensors are listed only at -lv 5.
    "moe-experts-on-cpu": lambda fx: LaunchSpec(
        model=fx.model("moe"), ctx_size=512, parallel=1, n_cpu_moe=1, log_verbosity=5),
    # Draft sizes (speculative.cpp), checkpoints (load_model) and an unmapped load
    # (load_tensors): all printed at -lv 4, none of them in /props or /slots.
    "dense-drafter-sizes-unmapped": lambda fx: LaunchSpec(
        model=fx.model("dense"), ctx_size=512, parallel=1, spec_type="draft-simple",
        drafter=fx.model("drafter"), spec_draft_n_min=2, spec_draft_n_max=5,
        spec_draft_p_min=0.75, ctx_checkpoints=5, checkpoint_min_step=64, load_mode="none"),
}

#: What each plan implies beyond its own fields.
IMPLIED: dict[str, dict[str, object]] = {
    "dense-with-drafter": {"drafter_loaded": True, "speculative_ready": True},
    "mtp-q8-cache": {"mtp_context": True, "speculative_ready": True},
    "dense-drafter-sizes-unmapped": {"drafter_loaded": True, "speculative_ready": True},
}

#: For "dense-drafter-sizes-unmapped": a value of each field that it was not started with.
OTHER_VALUES: dict[str, object] = {
    "spec_draft_n_min": 3, "spec_draft_n_max": 6, "spec_draft_p_min": 0.5,
    "ctx_checkpoints": 4, "checkpoint_min_step": 128, "load_mode": "mmap",
}


@pytest.mark.parametrize("name", PLANS)
def test_the_plan_reaches_the_server(name: str, fixture_set: modelgen.FixtureSet,
                                     start_server: StartServer) -> None:
    spec = PLANS[name](fixture_set)
    server = start_server(spec)
    log = server.log_text()
    planned = {field: getattr(spec, field) for field in PLAN_FIELDS} | IMPLIED.get(name, {})
    mismatches = compare_launch(planned, parse_launch_log(log))
    assert mismatches == (), "\n".join(map(str, mismatches))
    verdict = gpu_verdict(log, None)
    assert verdict.passed
    assert {block.state for block in verdict.blocks} == {GpuState.NO_GPU_EXPECTED}


def test_the_mtp_draft_context_keeps_f16(fixture_set: modelgen.FixtureSet,
                                         start_server: StartServer) -> None:
    report = parse_launch_log(start_server(PLANS["mtp-q8-cache"](fixture_set)).log_text())
    assert report.drafter is not None
    assert {line.type_k for line in report.drafter.kv_caches} == {"f16"}
    assert (report.type_k, report.target.flash_attn_forced if report.target else None) == (
        "q8_0", "quantized V cache")


def test_a_plan_the_server_was_not_given_is_caught(fixture_set: modelgen.FixtureSet,
                                                   start_server: StartServer) -> None:
    spec = PLANS["dense-drafter-sizes-unmapped"](fixture_set)
    report = parse_launch_log(start_server(spec).log_text())
    for field, other in OTHER_VALUES.items():
        (mismatch,) = compare_launch({field: other}, report)
        assert (mismatch.field, mismatch.planned, mismatch.observed) == (
            field, other, getattr(spec, field))
