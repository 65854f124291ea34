"""The launch planner end to end over real fixture facts (pure: facts are read once here)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import pytest

from harness import modelgen
from harness.facts.build import Capabilities
from harness.facts.gpu import CACHE_TYPES, STOCK_CACHE_TYPES, GpuInfo
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.routing import RouteReason
from harness.probes.bundles import load_bundle
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_fork_kv_types, load_gpu_configs

RTX_4090 = GpuInfo("NVIDIA GeForce RTX 4090", 24564)
UPSTREAM = Capabilities(cache_types_k=STOCK_CACHE_TYPES, cache_types_v=STOCK_CACHE_TYPES)
FORK = Capabilities(cache_types_k=CACHE_TYPES, cache_types_v=CACHE_TYPES)
GIB = 1 << 30


@pytest.fixture(scope="module")
def fixtures() -> modelgen.FixtureSet:
    return modelgen.ensure_fixtures()


def _bundle_request(fixtures: modelgen.FixtureSet, name: str, **changes: object) -> PlanRequest:
    bundle = load_bundle(fixtures.bundle(name))
    request = PlanRequest(
        model_path=bundle.text_model, model=read_model_facts(bundle.text_model), bundle=bundle,
        drafter_model=read_model_facts(bundle.drafter_path) if bundle.drafter_path else None,
        configs=load_gpu_configs(), capabilities=UPSTREAM, build_key="cpu-test",
        fork_kv_types=load_fork_kv_types(),
    )
    return dataclasses.replace(request, **changes)  # type: ignore[arg-type]


def _origins(plan: LaunchPlan) -> Mapping[str, str]:
    return plan.origins


def test_fused_bundle_without_gpu_uses_its_catalog_entry(fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense"))
    assert plan.route.reason is RouteReason.CATALOG
    assert plan.route.fused
    assert plan.spec.ctx_size == 2048
    assert (plan.spec.cache_type_k, plan.spec.cache_type_v) == ("f16", "f16")
    assert plan.origins["ctx_size"] == "catalog"
    assert plan.spec.spec_type == "draft-simple"
    assert plan.spec.drafter == plan.bundle_root / "text" / "tiny-dense-drafter.gguf"  # type: ignore[operator]
    assert plan.catalog is not None
    assert plan.catalog.id == "tiny-dense"
    assert plan.offload is None
    assert any("no GPU" in r for r in plan.reasons)


def test_card_values_fall_back_to_what_an_upstream_build_accepts(
        fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense", gpu=RTX_4090))
    assert plan.tune.label == "rtx-4090"
    assert plan.origins["parallel"] == "card"
    assert (plan.spec.cache_type_k, plan.spec.cache_type_v) == ("q8_0", "q4_0")
    assert plan.origins["cache_type_k"] == "capability-fallback"
    codes = [w.code for w in plan.warnings]
    assert codes.count("cache-type-fallback") == 2


def test_a_fork_build_keeps_the_fork_types(fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense", gpu=RTX_4090, capabilities=FORK))
    assert plan.spec.cache_type_k == "qjl1_256"
    assert plan.origins["cache_type_k"] == "card"


@pytest.mark.parametrize(("per_call", "environ", "origin", "ctx"), [
    pytest.param({}, {}, "card", 32768, id="card"),
    pytest.param({"ctx_size": 8192}, {}, "call", 8192, id="call-beats-card"),
    pytest.param({"ctx_size": 8192}, {"HARNESS_LLAMA_CTX_SIZE": "4096"}, "env", 4096,
                 id="env-beats-call"),
])
def test_layers_later_wins(fixtures: modelgen.FixtureSet, per_call: dict[str, object],
                           environ: dict[str, str], origin: str, ctx: int) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense", gpu=RTX_4090,
                                       per_call=per_call, environ=environ))
    assert plan.spec.ctx_size == ctx
    assert plan.origins["ctx_size"] == origin


def test_env_backend_override_is_recorded(fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense",
                                       environ={"HARNESS_INFERENCE_BACKEND": "llama-cpp"}))
    assert plan.route.reason is RouteReason.ENV_OVERRIDE


def test_mtp_bundle_runs_one_slot_on_its_own_head(fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-mtp", gpu=RTX_4090))
    assert plan.spec.spec_type == "draft-mtp"
    assert plan.spec.drafter is None
    assert plan.spec.parallel == 1
    assert plan.origins["parallel"] == "drafter"


def test_a_broken_drafter_is_left_out(fixtures: modelgen.FixtureSet) -> None:
    request = _bundle_request(fixtures, "fused-dense")
    assert request.bundle is not None
    broken = frozenset({("cpu-test", str(request.bundle.drafter_path))})
    plan = plan_launch(dataclasses.replace(request, broken_drafters=broken))
    assert plan.spec.drafter is None
    assert plan.spec.spec_type is None
    assert plan.drafter.left_out


def test_a_bare_model_routes_by_default_and_does_not_speculate(
        fixtures: modelgen.FixtureSet) -> None:
    path = fixtures.model("dense")
    plan = plan_launch(PlanRequest(model_path=path, model=read_model_facts(path)))
    assert plan.route.reason is RouteReason.DEFAULT
    assert plan.spec.spec_type is None
    assert plan.spec.model == path


def test_explicit_draft_mtp_on_a_model_without_a_head_is_dropped(
        fixtures: modelgen.FixtureSet) -> None:
    path = fixtures.model("dense")
    plan = plan_launch(PlanRequest(model_path=path, model=read_model_facts(path),
                                   explicit_spec_type="draft-mtp"))
    assert plan.spec.spec_type is None
    assert any("failed to create MTP context" in r for r in plan.reasons)


def _scaled(model: ModelFacts, factor: int) -> ModelFacts:
    """The same shape with every tensor ``factor`` times larger: a big MoE for planning."""
    layers = tuple(LayerBytes(b.index, b.expert * factor, b.dense_ffn * factor,
                              b.other * factor) for b in model.layer_bytes)
    return dataclasses.replace(model, layer_bytes=layers, file_size=model.file_size * factor,
                               non_layer_bytes=model.non_layer_bytes * factor)


@pytest.mark.parametrize(("vram_gib", "expect"), [
    pytest.param(80, set(), id="fits"),
    pytest.param(4, {"n_cpu_moe"}, id="partial-experts-to-ram"),
    pytest.param(2, {"cpu_moe"}, id="all-experts-to-ram"),
])
def test_moe_offload_fields_come_from_the_offload_plan(
        fixtures: modelgen.FixtureSet, vram_gib: int, expect: set[str]) -> None:
    path = fixtures.model("moe")
    model = _scaled(read_model_facts(path), 5000)  # ~1 GiB experts per block
    plan = plan_launch(PlanRequest(
        model_path=path, model=model, gpu=GpuInfo("Unknown GPU", vram_gib * 1024),
        configs=load_gpu_configs(), per_call={"ctx_size": 4096, "parallel": 1},
        fork_kv_types=load_fork_kv_types(),
    ))
    assert plan.offload is not None
    moved = {name for name, origin in plan.origins.items()
             if origin == "offload" and name != "n_gpu_layers"}
    assert moved == expect, plan.offload.reason
    assert plan.offload.reason in plan.reasons


def test_a_cache_type_without_a_known_layout_is_a_warning_not_a_crash(
        fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense", gpu=RTX_4090, capabilities=FORK,
                                       fork_kv_types=()))
    assert plan.kv is None
    assert [w.code for w in plan.warnings] == ["kv-unplanned"]
    assert "qjl1_256" in plan.warnings[0].message


def test_json_carries_kv_and_argv(fixtures: modelgen.FixtureSet) -> None:
    data = plan_launch(_bundle_request(fixtures, "fused-dense")).to_json("llama-server")
    assert data["kv"]["cells"] == 2048
    assert data["kv"]["k_bytes"] == data["kv"]["v_bytes"] > 0
    assert data["argv"][0] == "llama-server"
    assert data["fields"]["ctx_size"] == {"value": 2048, "origin": "catalog"}


@pytest.mark.parametrize("bundle", modelgen.BUNDLE_NAMES)
@pytest.mark.parametrize("gpu", [None, RTX_4090], ids=["cpu", "rtx-4090"])
def test_plan_argv_round_trips(fixtures: modelgen.FixtureSet, bundle: str,
                               gpu: GpuInfo | None) -> None:
    plan = plan_launch(_bundle_request(fixtures, bundle, gpu=gpu))
    assert LaunchSpec.from_argv(plan.to_argv("s", "127.0.0.1", 0)) == plan.spec
    assert set(plan.origins) <= {f.name for f in dataclasses.fields(LaunchSpec)}




@pytest.mark.parametrize(("per_call", "cells"), [
    ({"ctx_size": 777, "parallel": 1}, 1024),
    # Each of 3 slots gets pad(1024 // 3 = 341, 256) = 512 cells: 1536 in all.
    ({"ctx_size": 777, "parallel": 3}, 1536),
    ({"ctx_size": 100, "parallel": 1}, 256),
])
def test_a_context_the_server_pads_is_planned_padded_with_a_warning(
        fixtures: modelgen.FixtureSet, per_call: dict[str, object], cells: int) -> None:
    # llama-server accepts any --ctx-size and pads it (src/llama-context.cpp); the plan
    # forwards what was asked and sizes the KV cache for what the server allocates.
    plan = plan_launch(_bundle_request(fixtures, "fused-dense", per_call=per_call))
    assert plan.spec.ctx_size == per_call["ctx_size"]
    assert plan.kv is not None
    assert plan.kv.n_ctx == cells
    padded = [w for w in plan.warnings if w.code == "ctx-padded"]
    assert len(padded) == 1, plan.warnings
    assert (padded[0].field, padded[0].wanted, padded[0].used) == (
        "ctx_size", str(per_call["ctx_size"]), str(cells))
    assert f"pads --ctx-size {per_call['ctx_size']} to {cells} cells" in padded[0].message


def test_a_context_the_server_keeps_has_no_padding_warning(
        fixtures: modelgen.FixtureSet) -> None:
    plan = plan_launch(_bundle_request(fixtures, "fused-dense",
                                       per_call={"ctx_size": 1024, "parallel": 2}))
    assert plan.kv is not None
    assert plan.kv.n_ctx == 1024
    assert "ctx-padded" not in [w.code for w in plan.warnings]
