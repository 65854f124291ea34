"""The predicted decode speed (harness/planning/decode_speed.py) and the host bandwidth it
divides by (harness/probes/host_memory.py): bytes per token on each device, worked by
hand for small models, and ``harness plan`` printing it for every fixture and bundle."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_plan_cli import plan_json

from harness import modelgen
from harness.facts.gpu import GpuInfo
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.decode_speed import (
    GPU_EFFICIENCY,
    HOST_EFFICIENCY,
    Bandwidths,
    HostBandwidth,
    plan_bandwidths,
    predict_decode,
    predict_plan,
    prediction_depths,
)
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.planned_share import Offload
from harness.probes import host_memory as probe
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_fork_kv_types, load_gpu_configs

MIB = 1024 * 1024
HOST = Bandwidths(host_gbps=10.0, host_source="test")
GPU = Bandwidths(host_gbps=10.0, host_source="test", gpu_gbps=1000.0, gpu_source="test")


def _model(*, expert: int = 0, dense: int = 64 * MIB, other: int = 16 * MIB,
           blocks: int = 4, experts: tuple[int, int] = (0, 0)) -> ModelFacts:
    return ModelFacts(
        path="m.gguf", file_size=0, architecture="llama", block_count=blocks,
        context_length=4096, embedding_length=1024, head_count=8,
        head_count_kv=(2,) * blocks, key_length=128, value_length=128, vocab_size=32000,
        expert_count=experts[0], expert_used_count=experts[1],
        layer_bytes=tuple(LayerBytes(i, expert, dense, other) for i in range(blocks)),
        output_bytes=32 * MIB)


def _host_seconds(size: float) -> float:
    return size / (10.0e9 * HOST_EFFICIENCY)


def _gpu_seconds(size: float) -> float:
    return size / (1000.0e9 * GPU_EFFICIENCY)


def test_on_the_cpu_every_weight_and_the_output_come_from_host_memory() -> None:
    predicted = predict_decode(_model(), Offload(), None, HOST, depth=512)
    per_token = 4 * (64 + 16) * MIB + 32 * MIB
    assert predicted.host_bytes_per_token == per_token
    assert predicted.gpu_bytes_per_token == 0
    assert predicted.tokens_per_s == pytest.approx(1 / _host_seconds(per_token))


def test_a_moe_token_reads_only_its_share_of_the_experts() -> None:
    model = _model(expert=256 * MIB, dense=0, experts=(8, 2))
    predicted = predict_decode(model, Offload(), None, HOST, depth=512)
    assert predicted.host_bytes_per_token == 4 * (64 + 16) * MIB + 32 * MIB


def test_a_full_offload_reads_everything_at_the_cards_bandwidth() -> None:
    predicted = predict_decode(_model(), Offload(n_gpu_layers=99), None, GPU, depth=512)
    per_token = 4 * (64 + 16) * MIB + 32 * MIB
    assert predicted.host_bytes_per_token == 0
    assert predicted.gpu_bytes_per_token == per_token
    assert predicted.tokens_per_s == pytest.approx(1 / _gpu_seconds(per_token))


def test_partial_offload_splits_by_the_last_layers_and_the_overrides() -> None:
    model = _model(expert=256 * MIB, dense=0, experts=(8, 2))
    # -ngl 3 of 5 layers: blocks 2, 3 and the output on the GPU; --n-cpu-moe 3 keeps
    # block 2's experts (a quarter of them read per token) in host memory.
    predicted = predict_decode(model, Offload(n_gpu_layers=3, n_cpu_moe=3), None, GPU,
                               depth=512)
    block = 64 * MIB + 16 * MIB
    assert predicted.host_bytes_per_token == 2 * block + 64 * MIB
    assert predicted.gpu_bytes_per_token == 2 * block - 64 * MIB + 32 * MIB
    assert predicted.tokens_per_s == pytest.approx(
        1 / (_host_seconds(2 * block + 64 * MIB) + _gpu_seconds(2 * block - 64 * MIB
                                                                 + 32 * MIB)))


def test_a_small_model_is_flagged_against_the_last_level_cache() -> None:
    tiny = _model(dense=MIB, other=0, blocks=2)
    cached = Bandwidths(host_gbps=10.0, host_source="test", last_level_cache_bytes=32 * MIB)
    assert "last-level cache" in (predict_decode(tiny, Offload(), None, cached,
                                                 depth=512).caveat or "")
    assert predict_decode(_model(), Offload(), None, cached, depth=512).caveat is None


def test_the_kv_read_grows_with_depth_up_to_the_cache(fixture_set: modelgen.FixtureSet) -> None:
    path = fixture_set.model("dense")
    model = read_model_facts(path)
    plan = plan_launch(PlanRequest(model_path=path, model=model,
                                   fork_kv_types=load_fork_kv_types()))
    assert plan.kv is not None
    short, deep = (predict_decode(model, plan.spec, plan.kv, HOST, depth=d)
                   for d in (512, 2048))
    per_cell = plan.kv.total_bytes / plan.kv.caches[0].all_cells
    assert deep.host_bytes_per_token - short.host_bytes_per_token == pytest.approx(
        per_cell * (2048 - 512), abs=1)
    beyond = predict_decode(model, plan.spec, plan.kv, HOST, depth=10 * plan.kv.cells)
    full = predict_decode(model, plan.spec, plan.kv, HOST, depth=plan.kv.cells)
    assert beyond.host_bytes_per_token == full.host_bytes_per_token
    assert model.output_bytes > 0, "the reader finds the output matrix"


def test_depths_are_a_short_prompt_and_most_of_the_context() -> None:
    assert prediction_depths(4096) == (512, 2457)
    assert prediction_depths(256) == (256,)


def test_the_gpu_bandwidth_is_the_matched_cards_or_said_to_be_borrowed(
        fixture_set: modelgen.FixtureSet) -> None:
    path = fixture_set.model("dense")
    model = read_model_facts(path)
    host = HostBandwidth(20.0, "measured")
    configs = load_gpu_configs()

    def bandwidths(gpu: GpuInfo | None) -> Bandwidths | str:
        plan = plan_launch(PlanRequest(model_path=path, model=model, gpu=gpu,
                                       configs=configs, fork_kv_types=load_fork_kv_types()))
        return plan_bandwidths(plan, gpu, host)

    assert bandwidths(None) == Bandwidths(20.0, "measured")
    matched_gpu = GpuInfo("NVIDIA GeForce RTX 4090", 24564)
    matched = bandwidths(matched_gpu)
    assert isinstance(matched, Bandwidths)
    assert (matched.gpu_gbps, matched.gpu_source) == (1008.0, "rtx-4090, its config")
    borrowed = bandwidths(GpuInfo("Some Card", 24000))
    assert isinstance(borrowed, Bandwidths)
    assert "by the VRAM bucket" in borrowed.gpu_source
    plan = plan_launch(PlanRequest(model_path=path, model=model, gpu=matched_gpu,
                                   configs=configs, fork_kv_types=load_fork_kv_types()))
    on_card = predict_plan(plan, model, matched)
    assert on_card[0].gpu_bytes_per_token > 0
    assert on_card[0].tokens_per_s > predict_plan(plan, model, Bandwidths(20.0, "m"))[0] \
        .tokens_per_s, "the same plan read at the card's bandwidth is faster than on the host"


def test_the_host_figure_is_measured_once_per_host_and_a_damaged_cache_is_remeasured(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []

    def fake(*_: object, **__: object) -> float:
        calls.append(1)
        return 12.5

    monkeypatch.setattr(probe, "measure_read_gbps", fake)
    first = probe.host_memory(tmp_path)
    assert (first.read_gbps, len(calls)) == (12.5, 1)
    assert probe.host_memory(tmp_path) == first
    assert len(calls) == 1
    cached = tmp_path / probe.CACHE_NAME
    for damage in ("{", json.dumps({**json.loads(cached.read_text()), "read_gbps": "fast"}),
                   json.dumps({**json.loads(cached.read_text()), "host": "elsewhere"})):
        cached.write_text(damage)
        assert probe.host_memory(tmp_path).read_gbps == 12.5
    assert len(calls) == 4


def test_a_real_measurement_is_a_plausible_bandwidth() -> None:
    gbps = probe.measure_read_gbps(buffer_bytes=64 * MIB, passes=2)
    assert 0.1 < gbps < 10_000


#: Every fixture but the truncated one, which harness plan refuses by name (test_plan_cli).
PLANNABLE = [n for n in modelgen.FIXTURE_NAMES if n != "drafter-corrupt"]


@pytest.mark.parametrize("target", [*(("--model", n) for n in PLANNABLE),
                                    *(("--bundle", n) for n in modelgen.BUNDLE_NAMES)],
                         ids="-".join)
def test_harness_plan_prints_a_prediction_for_each_fixture_and_bundle(
        target: tuple[str, str], fixture_set: modelgen.FixtureSet) -> None:
    option, name = target
    path = fixture_set.model(name) if option == "--model" else fixture_set.bundle(name)
    data = plan_json(option, str(path))
    predictions = data["decode_prediction"]
    assert isinstance(predictions, list)
    assert predictions
    assert all(p["tokens_per_s"] > 0 and p["gpu_bytes_per_token"] == 0
               and p["host_bytes_per_token"] > 0 for p in predictions)
    on_card = plan_json(option, str(path), "--gpu", "NVIDIA H200", "--vram-mib", "143771")
    first = on_card["decode_prediction"]
    assert isinstance(first, list)
    assert first[0]["gpu_gbps"] == 4800
    assert first[0]["gpu_bytes_per_token"] > 0
