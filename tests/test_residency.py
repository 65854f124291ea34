"""The residency verdict: MiB per device from the log, the planned GPU share, and the check.

Composed log lines use the pinned source's format strings: src/llama-model.cpp
``load_tensors`` (``offloaded %d/%d layers to GPU``, ``%12s model buffer size = %8.2f MiB``)
and src/llama-kv-cache.cpp (``%10s KV buffer size = %8.2f MiB``). The corpus logs are held
to their sidecars in tests/test_log_corpus.py; here are the rules one at a time.
"""

from __future__ import annotations

import dataclasses
from decimal import Decimal
from pathlib import Path

import gguf
import pytest

from harness import modelgen
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.launch import LaunchSpec
from harness.planning.planned_share import (
    MIB,
    NonLayerBytes,
    Offload,
    non_layer_bytes,
    planned_gpu_share,
)
from harness.plugin.recording.recorder import ServerRecord
from harness.plugin.recording.story import verdicts_json
from harness.probes.gguf_facts import read_model_facts
from harness.verdicts.log_blocks import BlockKind, BlockRole
from harness.verdicts.residency import (
    HALF_PRINTED_UNIT_BYTES,
    LAYER_PAD_BYTES,
    Place,
    ShareOutcome,
    check_share,
    place_of,
    residency,
    residency_json,
    residency_verdict,
    tolerance_bytes,
)

CORPUS = Path(__file__).parent / "data" / "logs"


def _facts(blocks: int, *, expert: int = 0, dense_ffn: int = 0, other: int = 0,
           non_layer: int = 0) -> ModelFacts:
    layers = tuple(LayerBytes(i, expert, dense_ffn, other) for i in range(blocks))
    return ModelFacts(
        path="m.gguf", file_size=sum(layer.total for layer in layers) + non_layer,
        architecture="llama", block_count=blocks, context_length=4096, embedding_length=64,
        head_count=4, head_count_kv=(2,) * blocks, key_length=16, value_length=16,
        vocab_size=269, expert_count=8 if expert else 0, expert_used_count=2 if expert else 0,
        layer_bytes=layers, non_layer_bytes=non_layer)


def _log(*lines: str) -> str:
    return "".join(f"0.00.100.000 I {line}\n" for line in lines)


def _weights(buffer: str, mib: str) -> str:
    return f"load_tensors: {buffer:>12} model buffer size = {mib:>8} MiB"


def _kv(buffer: str, mib: str) -> str:
    return f"llama_kv_cache: {buffer:>10} KV buffer size = {mib:>8} MiB"


# --- buffer names ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "place"), [
    ("CUDA0", Place.GPU), ("CUDA1", Place.GPU), ("ROCm0", Place.GPU), ("Vulkan0", Place.GPU),
    ("SYCL0", Place.GPU), ("MTL0", Place.GPU), ("MTL0_Mapped", Place.GPU),
    ("CUDA_Split", Place.GPU),
    ("CPU", Place.HOST), ("CPU_Mapped", Place.HOST), ("CPU_REPACK", Place.HOST),
    ("CPU_KLEIDIAI", Place.HOST), ("AMX", Place.HOST), ("CUDA_Host", Place.HOST),
    ("ROCm_Host", Place.HOST), ("Vulkan_Host", Place.HOST),
    ("RPC0[10.0.0.2:50052]", Place.OTHER), ("Mystery", Place.OTHER),
])
def test_each_buffer_name_has_its_place(name: str, place: Place) -> None:
    assert place_of(name) is place


# --- what the log says -----------------------------------------------------------------------


def test_weights_and_kv_per_device_and_the_ollama_share() -> None:
    log = (CORPUS / "cuda" / "used.log").read_text(encoding="utf-8", errors="replace")
    (target,) = residency(log)
    assert target.role is BlockRole.TARGET
    assert [(h.buffer, h.place, h.mib) for h in target.weights] == [
        ("CPU_Mapped", Place.HOST, Decimal("0.07")), ("CUDA0", Place.GPU, Decimal("0.35"))]
    assert (target.weights_gpu_mib, target.weights_host_mib) == (Decimal("0.35"),
                                                                  Decimal("0.07"))
    assert (target.kv_gpu_mib, target.kv_host_mib) == (Decimal("0.50"), Decimal("0.00"))
    # 0.07 of 0.42 MiB in host memory: 16.7 % rounds to 17 (ollama rounds half up too).
    assert (target.cpu_percent, target.gpu_percent) == (17, 83)
    assert target.processor == "17%/83% CPU/GPU"
    assert target.offloaded_layers == (3, 3)


def test_the_three_processor_words() -> None:
    gpu_only = residency(_log(_weights("CUDA0", "100.00"), _kv("CUDA0", "8.00")))[0]
    cpu_only = residency(_log(_weights("CPU_Mapped", "100.00")))[0]
    split = residency(_log(_weights("CPU_Mapped", "48.00"), _weights("CUDA0", "52.00")))[0]
    assert (gpu_only.processor, cpu_only.processor, split.processor) == (
        "100% GPU", "100% CPU", "48%/52% CPU/GPU")


def test_repeated_buffer_lines_of_one_name_are_summed() -> None:
    # A multi-file (split GGUF) model maps one CPU_Mapped buffer per file.
    block = residency(_log(_weights("CPU_Mapped", "1.25"), _weights("CPU_Mapped", "0.75"),
                           _weights("CUDA0", "2.00")))[0]
    assert [(h.buffer, h.mib) for h in block.weights] == [("CPU_Mapped", Decimal("2.00")),
                                                          ("CUDA0", Decimal("2.00"))]
    assert block.processor == "50%/50% CPU/GPU"


def test_an_mtp_context_holds_kv_but_has_no_share() -> None:
    log = (CORPUS / "cuda" / "mtp-used.log").read_text(encoding="utf-8", errors="replace")
    target, mtp = residency(log)
    assert mtp.kind is BlockKind.MTP_CONTEXT
    assert mtp.weights == ()
    assert mtp.kv_gpu_mib == Decimal("0.12")
    assert (mtp.processor, mtp.cpu_percent, mtp.has_weights) == (None, None, False)
    assert target.processor == "11%/89% CPU/GPU"


def test_target_and_drafter_are_told_apart() -> None:
    log = (CORPUS / "cuda" / "drafter-on-cpu.log").read_text(encoding="utf-8",
                                                             errors="replace")
    target, drafter = residency(log)
    assert (target.role, drafter.role) == (BlockRole.TARGET, BlockRole.DRAFTER)
    assert target.weights_gpu_mib == Decimal("0.35")
    assert (drafter.weights_gpu_mib, drafter.weights_host_mib) == (Decimal("0.00"),
                                                                    Decimal("0.10"))
    assert drafter.processor == "100% CPU"


def test_an_unknown_buffer_is_counted_nowhere_and_warned_about() -> None:
    verdict = residency_verdict(_log(_weights("CPU_Mapped", "1.00"),
                                     _weights("RPC0[h:1]", "3.00")))
    (block,) = verdict.blocks
    assert (block.weights_gpu_mib, block.weights_host_mib) == (Decimal("0.00"),
                                                                Decimal("1.00"))
    assert len(verdict.warnings) == 1
    assert "RPC0[h:1]" in verdict.warnings[0]


def test_a_log_without_blocks_has_no_residency() -> None:
    assert residency("main: build info\n") == ()
    assert residency_verdict("main: build info\n").warnings == ()


# --- where the plan puts the tensors ---------------------------------------------------------

#: 4 blocks of 10 MiB (6 experts, 3 dense FFN, 1 other), input 5 MiB, output 2 MiB.
BLOCK = LayerBytes(0, 6 * MIB, 3 * MIB, 1 * MIB)
SPLIT = NonLayerBytes(input=5 * MIB, output=2 * MIB, duplicated=0)


def _moe() -> ModelFacts:
    return _facts(4, expert=BLOCK.expert, dense_ffn=BLOCK.dense_ffn, other=BLOCK.other,
                  non_layer=SPLIT.input + SPLIT.output)


@pytest.mark.parametrize(("ngl", "gpu_blocks", "output_on_gpu"), [
    (0, 0, False),
    # -ngl N takes the last N of the n_layer + 1 layers: the output layer first.
    (1, 0, True),
    (2, 1, True),
    (4, 3, True),
    (5, 4, True),
    # clamped to n_layer + 1
    (99, 4, True),
])
def test_ngl_offloads_the_last_layers_and_never_the_input(ngl: int, gpu_blocks: int,
                                                          output_on_gpu: bool) -> None:
    share = planned_gpu_share(_moe(), Offload(n_gpu_layers=ngl), SPLIT)
    gpu = gpu_blocks * BLOCK.total + (SPLIT.output if output_on_gpu else 0)
    assert (share.gpu_bytes, share.host_bytes) == (gpu, share.total_bytes - gpu)
    assert share.total_bytes == 4 * BLOCK.total + SPLIT.input + SPLIT.output
    assert share.gpu_layers == min(ngl, 5)
    assert share.unplaced_bytes == 0
    assert share.host_bytes >= SPLIT.input


@pytest.mark.parametrize(("offload", "kept"), [
    (Offload(99, n_cpu_moe=1), BLOCK.expert),
    (Offload(99, n_cpu_moe=3), 3 * BLOCK.expert),
    (Offload(99, cpu_moe=True), 4 * BLOCK.expert),
    (Offload(99, n_cpu_ffn=2), 2 * BLOCK.dense_ffn),
    (Offload(99, n_cpu_moe=1, n_cpu_ffn=1), BLOCK.expert + BLOCK.dense_ffn),
    # More blocks than the model has: every block.
    (Offload(99, n_cpu_moe=9), 4 * BLOCK.expert),
], ids=str)
def test_the_override_flags_keep_their_tensors_on_the_host(offload: Offload,
                                                           kept: int) -> None:
    every = planned_gpu_share(_moe(), Offload(n_gpu_layers=99), SPLIT)
    share = planned_gpu_share(_moe(), offload, SPLIT)
    assert share.override_host_bytes == kept
    assert every.gpu_bytes - share.gpu_bytes == kept
    assert share.host_bytes == SPLIT.input + kept


def test_an_override_on_a_block_already_on_the_cpu_moves_nothing_more() -> None:
    # -ngl 2: block 3 and the output on the GPU; --n-cpu-moe 2 names blocks 0 and 1,
    # which are on the CPU anyway.
    plain = planned_gpu_share(_moe(), Offload(n_gpu_layers=2), SPLIT)
    moved = planned_gpu_share(_moe(), Offload(n_gpu_layers=2, n_cpu_moe=2), SPLIT)
    assert moved == plain
    assert moved.override_host_bytes == 0
    reaching = planned_gpu_share(_moe(), Offload(n_gpu_layers=2, n_cpu_moe=4), SPLIT)
    assert reaching.override_host_bytes == BLOCK.expert


def test_a_launch_spec_is_an_offload_request() -> None:
    spec = LaunchSpec(model=Path("m.gguf"), n_gpu_layers=5, n_cpu_moe=2)
    assert planned_gpu_share(_moe(), spec, SPLIT) == planned_gpu_share(
        _moe(), Offload(n_gpu_layers=5, n_cpu_moe=2), SPLIT)


def test_a_tied_output_is_loaded_again_on_the_gpu() -> None:
    tied = NonLayerBytes(input=5 * MIB, output=1024, duplicated=5 * MIB)
    facts = _facts(2, other=MIB, non_layer=tied.input + tied.output)
    on_gpu = planned_gpu_share(facts, Offload(n_gpu_layers=99), tied)
    assert on_gpu.gpu_bytes == 2 * MIB + tied.output + tied.duplicated
    assert on_gpu.host_bytes == tied.input
    # On the host the duplicate maps the same file bytes: counted once.
    on_cpu = planned_gpu_share(facts, Offload(n_gpu_layers=0), tied)
    assert on_cpu.total_bytes == facts.non_layer_bytes + 2 * MIB


@pytest.mark.parametrize(("ngl", "engine", "layers", "basis"), [
    (None, None, 5, "taken as all"),
    (None, 3, 3, "as its log says"),
    (-1, 2, 2, "as its log says"),
    (-2, 2, 5, "-ngl all"),
])
def test_a_layer_count_left_to_the_server(ngl: int | None, engine: int | None, layers: int,
                                          basis: str) -> None:
    share = planned_gpu_share(_moe(), Offload(n_gpu_layers=ngl), SPLIT, engine_layers=engine)
    assert share.gpu_layers == layers
    assert basis in share.basis


def test_a_build_without_a_gpu_device_keeps_everything_on_the_host() -> None:
    share = planned_gpu_share(_moe(), Offload(n_gpu_layers=99, n_cpu_moe=2), SPLIT,
                              gpu_device=False)
    assert (share.gpu_bytes, share.gpu_layers, share.override_host_bytes) == (0, 0, 0)
    assert share.host_bytes == _moe().file_size
    assert share.gpu_share_range == (0.0, 0.0)


@pytest.mark.parametrize("split", [
    NonLayerBytes(input=5 * MIB, output=2 * MIB, duplicated=0),
    NonLayerBytes(input=7 * MIB - 1024, output=1024, duplicated=7 * MIB - 1024),
    NonLayerBytes(input=0, output=7 * MIB, duplicated=0),
])
@pytest.mark.parametrize("ngl", [0, 1, 3, 99])
def test_without_the_split_the_share_is_a_range_around_the_truth(split: NonLayerBytes,
                                                                 ngl: int) -> None:
    facts = _moe()
    known = planned_gpu_share(facts, Offload(n_gpu_layers=ngl), split)
    unknown = planned_gpu_share(facts, Offload(n_gpu_layers=ngl))
    low, high = unknown.gpu_share_range
    truth = known.gpu_share_range[0]
    assert low <= truth <= high
    assert unknown.gpu_bytes <= known.gpu_bytes <= unknown.gpu_bytes + unknown.unplaced_bytes
    if ngl == 0:
        assert unknown.unplaced_bytes == 0


def test_layer_bytes_must_cover_every_block() -> None:
    facts = _facts(3, other=MIB)
    broken = dataclasses.replace(facts, layer_bytes=facts.layer_bytes[:2])
    with pytest.raises(ValueError, match=r"blocks 0\.\.2"):
        planned_gpu_share(broken, Offload(n_gpu_layers=99))


def test_the_split_of_the_non_layer_tensors() -> None:
    tensors = [("token_embd.weight", 1000), ("position_embd.weight", 200),
               ("blk.0.attn_q.weight", 50), ("blk.1.ffn_up_exps.weight", 70),
               ("output_norm.weight", 10), ("output.weight", 900),
               # A block index past block_count is not a repeating block (a head's block).
               ("blk.2.nextn.eh_proj.weight", 30)]
    assert non_layer_bytes(tensors, 2) == NonLayerBytes(1200, 940, 0)
    tied = [t for t in tensors if t[0] != "output.weight"]
    assert non_layer_bytes(tied, 2) == NonLayerBytes(1200, 40, 1000)


# --- planned against observed ----------------------------------------------------------------


def _moe_log(gpu_mib: str, host_mib: str) -> str:
    """A 48-block MoE on a CUDA build that says every layer went to the GPU."""
    return _log("load_tensors: offloaded 49/49 layers to GPU",
                _weights("CPU_Mapped", host_mib), _weights("CUDA0", gpu_mib),
                _kv("CUDA0", "384.00"))


def _big_moe() -> tuple[ModelFacts, NonLayerBytes]:
    # 48 blocks: 512 MiB of experts, 24 MiB attention/router each; 250 MiB embeddings
    # and 250 MiB output head.
    split = NonLayerBytes(250 * MIB, 250 * MIB, 0)
    return _facts(48, expert=512 * MIB, other=24 * MIB, non_layer=500 * MIB), split


def test_offloaded_49_of_49_with_the_experts_in_host_memory_is_warned_about() -> None:
    facts, split = _big_moe()
    planned = planned_gpu_share(facts, Offload(n_gpu_layers=99), split)
    # What a stray --cpu-moe / -ot does: the experts (48 x 512 MiB) stay in CPU_Mapped.
    verdict = residency_verdict(_moe_log("1402.00", "24826.00"), {BlockRole.TARGET: planned})
    (check,) = verdict.checks
    assert check.outcome is ShareOutcome.MORE_ON_HOST
    assert verdict.warnings == (check.message,)
    # Both figures: the planned share and the observed one.
    assert "planned 99% GPU" in check.message
    assert "observed 95%/5% CPU/GPU" in check.message
    assert "49/49 layers" in check.message


def test_planned_n_cpu_moe_matches_the_experts_it_keeps_on_the_host() -> None:
    facts, split = _big_moe()
    planned = planned_gpu_share(facts, Offload(n_gpu_layers=99, n_cpu_moe=40), split)
    assert planned.override_host_bytes == 40 * 512 * MIB
    gpu = Decimal(planned.gpu_bytes) / MIB  # 48 x 24 + 8 x 512 + 250 MiB
    assert gpu == Decimal(5498)
    # The mapped CPU span is larger than the host tensors; only the GPU figure is held.
    verdict = residency_verdict(_moe_log("5498.00", "21500.00"), {BlockRole.TARGET: planned})
    assert verdict.checks[0].outcome is ShareOutcome.AS_PLANNED
    assert verdict.warnings == ()
    # The experts came to the GPU after all: the override did not apply.
    ignored = residency_verdict(_moe_log("25978.00", "250.00"), {BlockRole.TARGET: planned})
    assert ignored.checks[0].outcome is ShareOutcome.MORE_ON_GPU
    assert "override did not apply" in ignored.warnings[0]


def test_the_tolerance_edge() -> None:
    facts, split = _big_moe()
    planned = planned_gpu_share(facts, Offload(n_gpu_layers=99), split)
    allowed = tolerance_bytes(planned, 1)
    assert allowed == HALF_PRINTED_UNIT_BYTES + LAYER_PAD_BYTES * 49
    cent = Decimal("0.01")

    def outcome(gpu_bytes: int) -> ShareOutcome:
        # Printed as the server prints it: %.2f of the MiB.
        mib = (Decimal(gpu_bytes) / MIB).quantize(cent)
        block = residency(_log(_weights("CPU_Mapped", "250.00"), _weights("CUDA0", str(mib))))
        return check_share(block[0], planned).outcome

    assert outcome(planned.gpu_bytes) is ShareOutcome.AS_PLANNED
    assert outcome(planned.gpu_bytes - allowed + MIB // 100) is ShareOutcome.AS_PLANNED
    assert outcome(planned.gpu_bytes - allowed - MIB // 50) is ShareOutcome.MORE_ON_HOST
    assert outcome(planned.gpu_bytes + allowed - MIB // 100) is ShareOutcome.AS_PLANNED
    assert outcome(planned.gpu_bytes + allowed + MIB // 50) is ShareOutcome.MORE_ON_GPU


def test_a_planned_block_missing_from_the_log_is_warned_about() -> None:
    planned = planned_gpu_share(_moe(), Offload(n_gpu_layers=99), SPLIT)
    log = (CORPUS / "cuda" / "used.log").read_text(encoding="utf-8", errors="replace")
    verdict = residency_verdict(log, {BlockRole.DRAFTER: planned})
    assert verdict.checks == ()
    assert len(verdict.warnings) == 1
    assert verdict.warnings[0].startswith("drafter: planned ")


def test_a_block_that_printed_no_weights_cannot_be_held_to_its_plan() -> None:
    log = (CORPUS / "cuda" / "oom-weights.log").read_text(encoding="utf-8", errors="replace")
    planned = planned_gpu_share(_moe(), Offload(n_gpu_layers=99), SPLIT)
    verdict = residency_verdict(log, {BlockRole.TARGET: planned})
    assert verdict.checks[0].outcome is ShareOutcome.NO_BUFFERS
    assert verdict.warnings == (verdict.checks[0].message,)


# --- the real fixtures -----------------------------------------------------------------------


def _fixture_facts(fixture_set: modelgen.FixtureSet,
                   name: str) -> tuple[ModelFacts, NonLayerBytes, int]:
    path = fixture_set.model(name)
    facts = read_model_facts(path)
    tensors = [(str(t.name), int(t.n_bytes)) for t in gguf.GGUFReader(path).tensors]
    split = non_layer_bytes(tensors, facts.block_count)
    embd = next(size for tensor, size in tensors if tensor == "token_embd.weight")
    assert split.input == embd
    return facts, split, embd


def test_the_dense_fixture_on_the_gpu_keeps_only_its_embedding_on_the_host(
        fixture_set: modelgen.FixtureSet) -> None:
    facts, split, embd = _fixture_facts(fixture_set, "dense")
    share = planned_gpu_share(facts, Offload(n_gpu_layers=99), split)
    assert share.host_bytes == embd
    assert share.gpu_bytes == facts.non_layer_bytes + sum(
        layer.total for layer in facts.layer_bytes) - embd
    log = (CORPUS / "cuda" / "used.log").read_text(encoding="utf-8", errors="replace")
    assert residency_verdict(log, {BlockRole.TARGET: share}).warnings == ()


def test_the_moe_fixture_with_n_cpu_moe_1(fixture_set: modelgen.FixtureSet) -> None:
    facts, split, embd = _fixture_facts(fixture_set, "moe")
    share = planned_gpu_share(facts, Offload(n_gpu_layers=99, n_cpu_moe=1), split)
    assert share.override_host_bytes == facts.layer_bytes[0].expert > 0
    assert share.host_bytes == embd + facts.layer_bytes[0].expert
    # The fixture is small enough that one block's experts exceed the tolerance: a GPU
    # build that ignored --n-cpu-moe 1 would be caught.
    assert facts.layer_bytes[0].expert > tolerance_bytes(share, 1)


# --- the report attachment -------------------------------------------------------------------


def test_the_verdicts_attachment_carries_the_residency(tmp_path: Path) -> None:
    log = (CORPUS / "cuda" / "drafter-used.log").read_text(encoding="utf-8", errors="replace")
    record = ServerRecord(spec=LaunchSpec(model=Path("dense.gguf")), argv=["llama-server"],
                          log_path=tmp_path / "server.log", launched_at=0.0, ready_at=1.0)
    body = verdicts_json(record, log, "cuda")
    assert body["residency"] == residency_json(residency_verdict(log))
    target, drafter = body["residency"]["blocks"]
    assert (target["role"], target["processor"], target["weights_gpu_mib"]) == (
        "target", "17%/83% CPU/GPU", "0.35")
    assert (drafter["role"], drafter["kv_mib"]) == ("drafter", {"CUDA0": "0.06"})
