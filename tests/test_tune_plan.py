"""``harness tune``'s pure parts: the candidates the planner gives, their rank, and the
winner rule on measured verdicts."""

from __future__ import annotations

from dataclasses import replace

import pytest

from harness import modelgen
from harness.ab.decision import MetricDecision
from harness.ab.stats import RatioInterval
from harness.commands.plan import plan_request
from harness.facts.build import Capabilities
from harness.facts.model_facts import LayerBytes
from harness.planning.decode_speed import HostBandwidth, plan_bandwidths
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.offload import OffloadKind
from harness.probes.gguf_facts import read_model_facts
from harness.results.rules import AbVerdict
from harness.tune.candidates import (
    BATCH,
    DIMENSIONS,
    DRAFTER,
    KV,
    OFFLOAD,
    SLOTS,
    THREADS,
    Candidate,
    TuneSpace,
    parse_dimensions,
    plan_candidates,
)
from harness.tune.quality import load_kv_quality, pair_quality, pair_read_cost
from harness.tune.winner import Measured, judge

STOCK = ("f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0")
RTX_4090 = ("NVIDIA GeForce RTX 4090", 24564)


def _request(gpu: tuple[str, int] | None = RTX_4090, **environ: str) -> PlanRequest:
    model = modelgen.ensure_fixtures().model("bench")
    request = plan_request(None, model, gpu_name=gpu[0] if gpu else None,
                           vram_mib=gpu[1] if gpu else None, build=None, overrides={})
    return replace(request, capabilities=Capabilities(cache_types_k=STOCK,
                                                      cache_types_v=STOCK),
                   environ=environ)


def _space(request: PlanRequest, *, host_cores: int | None = None,
           dimensions: tuple[str, ...] = DIMENSIONS) -> TuneSpace:
    bandwidths = plan_bandwidths(plan_launch(request), request.gpu,
                                 HostBandwidth(20.0, "a test's figure"))
    return TuneSpace(request=request, weights=load_kv_quality(), bandwidths=bandwidths,
                     host_cores=host_cores, current_threads=host_cores,
                     dimensions=dimensions)


def test_every_candidate_changes_one_dimension_of_the_cards_plan() -> None:
    current, ranked = plan_candidates(_space(_request()))
    # The 4090's card plans q8_0 K with a fork V type the stock build lacks (q4_0 then).
    assert (current.plan.spec.cache_type_k, current.plan.spec.cache_type_v) == ("q8_0", "q4_0")
    assert current.quality == pytest.approx(0.93)
    names = {c.name for c in ranked}
    assert {"kv f16", "kv q8_0", "kv q4_0", "flash-attn off", "ubatch 256", "ubatch 1024",
            "slots 1"} <= names
    # No threads on a GPU build; only weighted types (bf16, q4_1, q5_0 have no weight).
    assert not any(c.dimension == THREADS for c in ranked)
    assert not names & {"kv bf16", "kv q4_1", "kv q5_0"}
    for candidate in ranked:
        assert candidate.pruned is None, candidate
        assert candidate.differs, candidate.name
        fields = {d.split()[0] for d in candidate.differs}
        wanted = {KV: {"cache_type_k", "cache_type_v"}, BATCH: {"batch_size", "ubatch_size"},
                  SLOTS: {"parallel"}}.get(candidate.dimension or "")
        if wanted is not None:
            assert fields <= wanted, candidate.differs


def test_rank_is_predicted_decode_times_the_kv_quality() -> None:
    current, ranked = plan_candidates(_space(_request()))
    scores = [c.score for c in ranked]
    assert all(s is not None for s in scores)
    assert scores == sorted(scores, reverse=True)  # type: ignore[type-var]
    for candidate in ranked:
        assert candidate.score == pytest.approx(
            candidate.predicted_tps * candidate.quality)  # type: ignore[operator]
    # The same prediction ties, and the dimension order breaks the tie: a batch change
    # reads the same bytes per token as the current plan.
    ubatch = next(c for c in ranked if c.name == "ubatch 256")
    assert ubatch.predicted_tps == pytest.approx(current.predicted_tps)
    # q8_0 in place of the q4_0 V: more bytes, but a better weight wins over 0.93.
    q8 = next(c for c in ranked if c.name == "kv q8_0")
    assert q8.quality == pytest.approx(0.99)
    assert q8.score > ubatch.score  # type: ignore[operator]


def test_a_candidate_a_layer_above_overrides_is_pruned_with_the_reason() -> None:
    _, ranked = plan_candidates(_space(_request(HARNESS_LLAMA_UBATCH_SIZE="128")))
    pruned = [c for c in ranked if c.dimension == BATCH]
    assert pruned
    assert all(c.pruned for c in pruned)
    assert "environment" in str(pruned[0].pruned)
    assert ranked[-1].pruned is not None  # pruned ones come last


def test_a_host_build_tries_threads_and_the_dimensions_can_be_chosen() -> None:
    space = _space(_request(gpu=None), host_cores=8, dimensions=parse_dimensions(["threads"]))
    current, ranked = plan_candidates(space)
    assert current.threads == 8
    assert [c.name for c in ranked] == ["threads 4", "threads 7"]
    assert ranked[0].differs == ("threads 8 -> 4",)
    assert parse_dimensions(["kv,batch", "slots"]) == (KV, BATCH, SLOTS)
    with pytest.raises(ValueError, match="threadz: not a dimension"):
        parse_dimensions(["threadz"])


def _bundle_request(name: str) -> PlanRequest:
    request = plan_request(modelgen.ensure_fixtures().bundle(name), None,
                           gpu_name=RTX_4090[0], vram_mib=RTX_4090[1], build=None,
                           overrides={})
    return replace(request, capabilities=Capabilities(cache_types_k=STOCK,
                                                      cache_types_v=STOCK))


def test_a_plan_that_drafts_is_tried_without_its_drafter() -> None:
    space = _space(_bundle_request("fused-mtp"), dimensions=(DRAFTER,))
    current, ranked = plan_candidates(space)
    assert current.plan.spec.spec_type == "draft-mtp"
    [off] = ranked
    assert off.name == "drafter off (was draft-mtp)"
    assert off.pruned is None, off.pruned
    assert off.plan.spec.spec_type is None
    assert "spec_type draft-mtp -> default" in off.differs
    # draft-mtp held the plan to one slot; without it the card's slots come back.
    assert any(d.startswith("parallel 1 -> ") for d in off.differs), off.differs


def test_a_model_that_could_draft_is_tried_with_a_drafter_and_one_that_cannot_is_not(
) -> None:
    # The MTP bundle with speculation turned off above the call: the drafter-on
    # candidate asks for draft-mtp again and the planner plans it.
    off = replace(_bundle_request("fused-mtp"), explicit_spec_type="none")
    current, ranked = plan_candidates(_space(off, dimensions=(DRAFTER,)))
    assert current.plan.spec.spec_type is None
    [on] = ranked
    assert (on.name, on.spec_type, on.plan.spec.spec_type) == (
        "drafter on (draft-mtp)", "draft-mtp", "draft-mtp")
    assert on.pruned is None
    # The dense bundle drafts with its small drafter file: tried without it.
    [simple_off] = plan_candidates(_space(_bundle_request("fused-dense"),
                                          dimensions=(DRAFTER,)))[1]
    assert (simple_off.name, simple_off.plan.spec.spec_type) == (
        "drafter off (was draft-simple)", None)
    # A bare model with no head and no drafter file has nothing to draft with.
    assert plan_candidates(_space(_request(), dimensions=(DRAFTER,)))[1] == ()


def _big_moe_request(vram_gib: int) -> PlanRequest:
    """The MoE fixture planned as if every tensor were 5000 times larger (~1 GiB of
    experts a block), on a card with ``vram_gib``."""
    path = modelgen.ensure_fixtures().model("moe")
    facts = read_model_facts(path)
    layers = tuple(LayerBytes(b.index, b.expert * 5000, b.dense_ffn * 5000, b.other * 5000)
                   for b in facts.layer_bytes)
    model = replace(facts, layer_bytes=layers, file_size=facts.file_size * 5000,
                    non_layer_bytes=facts.non_layer_bytes * 5000)
    request = plan_request(None, path, gpu_name=RTX_4090[0], vram_mib=vram_gib * 1024,
                           build=None, overrides={"ctx_size": 4096})
    return replace(request, model=model,
                   capabilities=Capabilities(cache_types_k=STOCK, cache_types_v=STOCK))


def test_a_model_split_across_gpu_and_host_is_tried_with_the_planners_other_splits(
) -> None:
    current, ranked = plan_candidates(_space(_big_moe_request(4), dimensions=(OFFLOAD,)))
    assert current.plan.offload is not None
    assert current.plan.offload.kind is OffloadKind.N_CPU_MOE
    n = current.plan.spec.n_cpu_moe
    by_name = {c.name: c for c in ranked}
    assert set(by_name) == {"offload --cpu-moe", "offload whole layers"}
    every_expert = by_name["offload --cpu-moe"]
    # Measured although it moves more to the host: a different split is the question.
    assert every_expert.pruned is None
    assert every_expert.plan.spec.cpu_moe
    assert every_expert.plan.spec.n_cpu_moe is None
    assert f"n_cpu_moe {n} -> default" in every_expert.differs
    assert "cpu_moe False -> True" in every_expert.differs
    layers = by_name["offload whole layers"]
    assert layers.plan.offload is not None
    assert layers.plan.offload.kind is OffloadKind.LAYER_SPLIT
    # Asked, not lacking: the plan says so and warns of no unsupported switch.
    assert "--n-cpu-moe left out as asked" in layers.plan.offload.reason
    assert layers.plan.offload.wanted is None
    assert not layers.plan.warnings
    # A model that fits has no offload candidates.
    assert plan_candidates(_space(_big_moe_request(80), dimensions=(OFFLOAD,)))[1] == ()


def test_the_quality_table_is_seed_004s() -> None:
    weights = load_kv_quality()
    assert [(w.name, w.quality, w.read_cost) for w in weights.values()] == [
        ("f16", 1.0, 1.0), ("q8_0", 0.99, 1.0), ("q4_0", 0.93, 12.0)]
    assert pair_quality(weights, "q8_0", "q4_0") == 0.93
    assert pair_quality(weights, "q8_0", "q4_polar") is None
    assert pair_read_cost(weights, "f16", "q4_0") == 6.5


# --- the winner rule -----------------------------------------------------------------


def _decision(metric: str, verdict: AbVerdict, low: float, high: float) -> MetricDecision:
    return MetricDecision(metric=metric, verdict=verdict,
                          interval=RatioInterval((low + high) / 2, low, high, 0.95, 8),
                          baseline_median=1.0, candidate_median=1.0, pairs=8)


def _measured(name: str, *decisions: MetricDecision, error: str | None = None) -> Measured:
    current, _ = plan_candidates(_space(_request(), dimensions=(SLOTS,)))
    candidate: Candidate = replace(current, name=name, differs=(f"{name} changed",))
    return Measured(candidate, decisions=decisions, error=error)


def test_a_winner_needs_a_whole_interval_past_the_threshold_and_nothing_slower() -> None:
    faster = _measured("a", _decision("prompt_tps", AbVerdict.IMPROVED, 1.8, 2.2),
                       _decision("decode_tps", AbVerdict.UNKNOWN, 0.97, 1.04))
    much_faster = _measured("b", _decision("decode_tps", AbVerdict.IMPROVED, 1.2, 1.3),
                            _decision("ttft_ms", AbVerdict.IMPROVED, 0.4, 0.5))
    traded = _measured("c", _decision("prompt_tps", AbVerdict.IMPROVED, 3.0, 4.0),
                       _decision("decode_tps", AbVerdict.REGRESSED, 0.5, 0.6))
    failed = _measured("d", error="the candidate server exited")
    verdict = judge([faster, much_faster, traded, failed], 0.05)
    assert verdict.winner is much_faster  # 1.2 x (1 / 0.5) = 2.4 beats 1.8
    assert [m.candidate.name for m in verdict.better] == ["b", "a"]
    assert (traded.verdict, failed.verdict, faster.verdict) == ("worse", "failed", "better")
    assert "decode_tps x1.200 or more" in verdict.summary


def test_overlapping_intervals_never_make_a_winner() -> None:
    close = _measured("a", _decision("decode_tps", AbVerdict.UNKNOWN, 0.99, 1.09),
                      _decision("prompt_tps", AbVerdict.UNCHANGED, 0.98, 1.02))
    same = _measured("b", _decision("decode_tps", AbVerdict.UNCHANGED, 0.99, 1.01))
    verdict = judge([close, same], 0.05)
    assert verdict.holds
    assert verdict.better == ()
    assert verdict.summary.startswith("the current plan holds: none of the 2 candidates")
    assert (close.verdict, same.verdict) == ("undecided", "same")
