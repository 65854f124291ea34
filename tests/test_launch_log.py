"""The launch-log parsers (``harness/verdicts/log_blocks.py``, ``block_report.py``,
``launch_report.py``, ``plan_check.py``), line by line.

Lines marked "captured" were printed by the pinned llama-server (CPU build, ``-lv 4`` or
``-lv 5``) for the fixtures; the GPU lines are written from the pinned source's format
strings (the function is named beside each), as in ``tests/data/logs``.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from harness.facts.build import Backend
from harness.facts.gpu import LoadMode
from harness.planning.kv import CacheRole
from harness.verdicts.block_report import (
    AllocFailure,
    BlockReport,
    BufferSize,
    DeviceUse,
    FlashAttnMode,
    TensorOverride,
    parse_block,
)
from harness.verdicts.launch_report import DraftParams, LaunchReport, parse_launch_log
from harness.verdicts.log_blocks import BlockKind, BlockRole, LogBlock, message, split_blocks
from harness.verdicts.plan_check import Mismatch, applied_n_ctx, comparable_fields, compare_launch
from harness.verdicts.unverifiable_fields import CPU_UNVERIFIABLE, unverifiable

DENSE = "/root/.cache/llama-harness/fixtures/ab425a6bb1be3f5e/models/dense.gguf"
DRAFTER = "/root/.cache/llama-harness/fixtures/ab425a6bb1be3f5e/models/drafter.gguf"


def block_of(*lines: str) -> BlockReport:
    return parse_block(LogBlock(BlockRole.TARGET, BlockKind.MODEL, None, lines))


# --- single lines ----------------------------------------------------------------------------

LINE_CASES = [
    # (line, field, value); captured unless a function is named.
    ("0.00.006.584 I llama_context: n_ctx                 = 2048", "n_ctx", 2048),
    ("0.00.006.584 I llama_context: n_ctx_seq             = 1024", "n_ctx_seq", 1024),
    ("0.00.006.584 I llama_context: n_ctx_seq             = 1024", "n_ctx", None),
    ("0.00.006.584 I llama_context: n_batch               = 2048", "n_batch", 2048),
    ("0.00.006.585 I llama_context: n_ubatch              = 512", "n_ubatch", 512),
    ("0.00.006.584 I llama_context: n_seq_max             = 2", "n_seq_max", 2),
    ("0.00.006.585 I llama_context: kv_unified            = false", "kv_unified", False),
    ("0.00.009.450 I llama_context: kv_unified            = true", "kv_unified", True),
    ("0.00.006.585 I llama_context: flash_attn            = auto", "flash_attn_mode",
     FlashAttnMode.AUTO),
    ("0.00.009.032 I llama_context: flash_attn            = enabled", "flash_attn", True),
    ("0.00.009.482 I llama_context: flash_attn            = disabled", "flash_attn", False),
    ("0.00.006.585 I llama_context: flash_attn            = auto", "flash_attn", None),
    ("0.00.009.003 I llama_init_from_model: enabling flash_attn since it is required for "
     "quantized V cache", "flash_attn_forced", "quantized V cache"),
    ("0.00.006.240 I print_info: n_ctx_train           = 4096", "n_ctx_train", 4096),
    ("0.00.006.446 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB",
     "model_buffers", (BufferSize("CPU_Mapped", Decimal("0.41")),)),
    # src/llama-model.cpp load_tensors, "%12s model buffer size = %8.2f MiB"
    ("0.00.008.642 I load_tensors:        CUDA0 model buffer size =     0.35 MiB",
     "model_buffers", (BufferSize("CUDA0", Decimal("0.35")),)),
    ("0.00.006.615 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB",
     "kv_buffers", (BufferSize("CPU", Decimal("0.50")),)),
    ("0.00.007.938 I sched_reserve:        CPU compute buffer size =     2.14 MiB",
     "compute_buffers", (BufferSize("CPU", Decimal("2.14")),)),
    # The DEBUG check at teardown ("compute buffer size is …") is not a buffer line.
    ("0.00.398.412 D ~llama_context:        CPU compute buffer size is   1.8926 MiB, matches "
     "expectation of   1.8926 MiB", "compute_buffers", ()),
    # src/llama-model.cpp load_tensors, "offloaded %d/%d layers to GPU"
    ("0.00.008.356 I load_tensors: offloaded 3/3 layers to GPU", "offloaded_layers", (3, 3)),
    ("0.00.008.356 I load_tensors: offloaded 0/3 layers to GPU", "offloaded_layers", (0, 3)),
    # src/llama.cpp llama_prepare_model_devices
    ("0.00.008.017 I llama_prepare_model_devices: using device CUDA0 (NVIDIA GeForce RTX 4090) "
     "(0000:01:00.0) - 23592 MiB free", "devices",
     (DeviceUse("CUDA0", "NVIDIA GeForce RTX 4090", "0000:01:00.0", 23592),)),
    ("0.00.008.017 I llama_prepare_model_devices: using device Vulkan0 (llvmpipe (LLVM 19.1.7, "
     "256 bits)) (unknown id) - 24105 MiB free", "devices",
     (DeviceUse("Vulkan0", "llvmpipe (LLVM 19.1.7, 256 bits)", "unknown id", 24105),)),
    # docs/design.md quotes the line without its id and free memory.
    ("using device Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits))", "devices",
     (DeviceUse("Vulkan0", "llvmpipe (LLVM 19.1.7, 256 bits)", None, None),)),
    ("0.00.009.170 D tensor blk.0.ffn_gate_exps.weight (0 MiB f32) buffer type overridden to CPU",
     "overrides", (TensorOverride("blk.0.ffn_gate_exps.weight", 0, 0, "f32", "CPU"),)),
    ("0.00.009.170 D tensor output.weight (12 MiB q8_0) buffer type overridden to CUDA0",
     "overrides", (TensorOverride("output.weight", None, 12, "q8_0", "CUDA0"),)),
    # ggml/src/ggml-backend.cpp ggml_backend_buft_alloc_buffer_n_default
    ("0.00.005.651 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer "
     "of size 30720000000", "alloc_failures", (AllocFailure(
         "CUDA0", "ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer "
         "of size 30720000000"),)),
    # ggml/src/ggml-cuda/ggml-cuda.cu ggml_backend_cuda_buffer_type_alloc_buffer
    ("0.00.005.651 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 29296.88 MiB on "
     "device 0: cudaMalloc failed: out of memory", "alloc_failures", (AllocFailure(
         None, "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 29296.88 MiB on device 0: "
         "cudaMalloc failed: out of memory"),)),
    # ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp (std::cerr, no prefix; docs/design.md measured)
    ("ggml_vulkan: Device memory allocation of size 7680000000 failed.", "alloc_failures",
     (AllocFailure(None, "ggml_vulkan: Device memory allocation of size 7680000000 failed."),)),
    ("0.00.017.631 I load_tensors: loading model tensors, this can take a while... "
     "(load_mode = mmap)", "load_mode", LoadMode.MMAP),
    ("0.00.007.506 I load_tensors: loading model tensors, this can take a while... "
     "(load_mode = mmap+mlock)", "load_mode", LoadMode.MMAP_MLOCK),
    ("0.00.032.486 I load_tensors: loading model tensors, this can take a while... "
     "(load_mode = dio)", "load_mode", LoadMode.DIO),
    ("0.00.007.105 I load_tensors:          CPU model buffer size =     0.41 MiB",
     "weights_mapped", False),
    ("0.00.017.815 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB",
     "weights_mapped", True),
    ("0.00.018.164 I llama_kv_cache:        CPU KV buffer size =     0.12 MiB", "kv_on_gpu",
     False),
    # src/llama-kv-cache.cpp llama_kv_cache, "%10s KV buffer size = %8.2f MiB" on the device
    ("0.00.008.731 I llama_kv_cache:      CUDA0 KV buffer size =     0.12 MiB", "kv_on_gpu",
     True),
    # src/llama.cpp llama_prepare_model_devices (--split-mode tensor, default devices)
    ("0.00.008.010 I llama_model_load_from_file_impl: creating a Meta device for tensor "
     "parallelism from 2 devices:", "tensor_split_devices", 2),
    # … and with an explicit --device list
    ("0.00.008.010 I llama_model_load_from_file_impl: creating a Meta device with 3 devices",
     "tensor_split_devices", 3),
    ("0.00.008.017 I llama_prepare_model_devices: using device CUDA1 (NVIDIA H200) "
     "(0000:02:00.0) - 143000 MiB free", "gpu_devices", ("CUDA1",)),
    # src/llama.cpp llama_model_load, the load_tensors exception
    ("0.00.005.027 E llama_model_load: error loading model: unable to allocate CUDA0 buffer",
     "alloc_failures", (AllocFailure(
         "CUDA0", "llama_model_load: error loading model: unable to allocate CUDA0 buffer"),)),
]


@pytest.mark.parametrize(("line", "field", "value"), LINE_CASES,
                         ids=[f"{case[1]}: {message(case[0])[:60]}" for case in LINE_CASES])
def test_one_line(line: str, field: str, value: object) -> None:
    assert getattr(block_of(line), field) == value


def test_auto_flash_attention_takes_the_resolved_value() -> None:
    auto = "0.00.006.585 I llama_context: flash_attn            = auto"
    assert block_of(auto, "0.00.007.536 I resolve_fused_ops: Flash Attention enabled").flash_attn
    # src/llama-context.cpp resolve_fused_ops: "%s not supported, set to disabled" (WARN)
    refused = "0.00.007.536 W resolve_fused_ops: Flash Attention not supported, set to disabled"
    assert block_of(auto, refused).flash_attn is False


def test_the_first_context_line_wins_within_a_block() -> None:
    block = block_of("0.00.006.584 I llama_context: n_ctx                 = 2048",
                     "0.00.009.584 I llama_context: n_ctx                 = 4096")
    assert block.n_ctx == 2048


def test_kv_cache_lines_go_through_kv_log() -> None:
    (cache,) = block_of(
        "0.00.006.885 I llama_kv_cache: size =    0.50 MiB (  1024 cells,   2 layers,  2/2 seqs),"
        " K (f16):    0.25 MiB, V (f16):    0.25 MiB").kv_caches
    assert (cache.role, cache.cells, cache.type_k, cache.k_mib) == (
        CacheRole.KV, 1024, "f16", Decimal("0.25"))


def test_model_buffers_are_summed_per_buffer() -> None:
    block = block_of("I load_tensors:   CPU_Mapped model buffer size =     0.07 MiB",
                     "I load_tensors:        CUDA0 model buffer size =     0.35 MiB",
                     "I load_tensors:        CUDA0 model buffer size =     0.10 MiB")
    assert block.model_buffers_mib == {"CPU_Mapped": Decimal("0.07"), "CUDA0": Decimal("0.45")}


@pytest.mark.parametrize(("line", "text"), [
    ("0.00.006.446 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB",
     "load_tensors:   CPU_Mapped model buffer size =     0.41 MiB"),
    ("0.00.009.170 D tensor blk.0.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU",
     "tensor blk.0.ffn_up_exps.weight (0 MiB f32) buffer type overridden to CPU"),
    ("warning: no usable GPU found, --gpu-layers option will be ignored",
     "warning: no usable GPU found, --gpu-layers option will be ignored"),
], ids=["info", "debug", "unprefixed"])
def test_message_drops_timestamp_and_level(line: str, text: str) -> None:
    assert message(line) == text


# --- blocks ----------------------------------------------------------------------------------

TARGET_LOAD = [
    f"0.00.003.964 I srv    load_model: loading model '{DENSE}'",
    "0.00.003.982 I cmn  common_init_: fitting params to device memory ...",
    "0.00.004.031 I common_params_fit_impl: getting device memory data for initial parameters:",
    # --fit's dry run, visible at -lv 5 (common/fit.cpp): not the real load
    "0.00.006.315 I load_tensors: loading model tensors, this can take a while... "
    "(load_mode = none)",
    "0.00.006.718 I load_tensors:        CUDA0 model buffer size =     0.00 MiB",
    "0.00.006.758 I llama_context: n_ctx                 = 99999",
    "0.00.005.823 I common_fit_params: fitting params to free memory took 0.00 seconds",
    f"0.00.005.928 I llama_model_loader: loaded meta data with 19 key-value pairs and 21 tensors "
    f"from {DENSE} (version GGUF V3 (latest))",
    "0.00.006.446 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB",
    "0.00.006.584 I llama_context: n_ctx                 = 2048",
]
DRAFT_LOAD = [
    f"0.00.011.270 I common_speculative_init_result: loading draft model '{DRAFTER}'",
    "0.00.011.835 I load_tensors:   CPU_Mapped model buffer size =     0.10 MiB",
    "0.00.011.888 I llama_context: n_ctx                 = 1024",
]
SERVER_READY = [
    "0.00.015.118 I srv    load_model: initializing, n_slots = 1, n_ctx_slot = 1024, "
    "kv_unified = 'false'",
    "0.00.015.129 I spec common_specu: adding speculative implementation 'draft-simple'",
    "0.00.015.532 I srv    load_model: speculative decoding context initialized",
    # after the blocks: the MTP context's second reserve, not a block line
    "0.00.016.952 I sched_reserve:        CPU compute buffer size =     1.51 MiB",
]


def test_the_fit_dry_run_is_not_a_block() -> None:
    (target,) = split_blocks("\n".join(TARGET_LOAD))
    assert (target.role, target.kind, target.model_path) == (BlockRole.TARGET, BlockKind.MODEL,
                                                             DENSE)
    assert parse_block(target).n_ctx == 2048
    assert parse_block(target).model_buffers == (BufferSize("CPU_Mapped", Decimal("0.41")),)


def test_a_draft_model_has_its_own_block_up_to_the_slots_line() -> None:
    target, drafter = split_blocks("\n".join(TARGET_LOAD + DRAFT_LOAD + SERVER_READY))
    assert (drafter.role, drafter.kind, drafter.model_path) == (BlockRole.DRAFTER,
                                                                BlockKind.MODEL, DRAFTER)
    assert parse_block(drafter).n_ctx == 1024
    assert parse_block(drafter).compute_buffers == ()
    assert parse_block(target).n_ctx == 2048


def test_an_mtp_context_is_a_drafter_block_without_a_model() -> None:
    mtp = [f"0.00.010.453 I common_speculative_init_result: creating MTP draft context against "
           f"the target model '{DENSE}'",
           "0.00.010.536 I llama_kv_cache:        CPU KV buffer size =     0.12 MiB"]
    _, drafter = split_blocks("\n".join(TARGET_LOAD + mtp + SERVER_READY))
    assert (drafter.kind, drafter.model_path) == (BlockKind.MTP_CONTEXT, DENSE)
    assert parse_block(drafter).kv_buffers == (BufferSize("CPU", Decimal("0.12")),)


def test_a_log_with_no_model_lines_has_no_blocks() -> None:
    assert split_blocks("0.00.000.984 I srv  llama_server: initializing ...\n") == ()
    assert split_blocks("") == ()


# --- the whole launch ------------------------------------------------------------------------


def test_the_server_level_lines() -> None:
    report = parse_launch_log("\n".join(TARGET_LOAD + DRAFT_LOAD + SERVER_READY))
    assert (report.n_slots, report.n_ctx_slot, report.slots_kv_unified) == (1, 1024, False)
    assert report.speculative_types == ("draft-simple",)
    assert report.speculative_ready
    assert report.drafter_path == DRAFTER
    assert report.drafter_loaded
    assert not report.mtp_context_created
    assert report.speculative_error is None


@pytest.mark.parametrize(("line", "error"), [
    (f"0.00.012.127 E srv    load_model: failed to load draft model, '{DRAFTER}'",
     f"failed to load draft model, '{DRAFTER}'"),
    ("0.00.043.231 E srv    load_model: failed to create MTP context",
     "failed to create MTP context"),
    ("0.00.053.264 E srv    load_model: failed to initialize speculative decoding context: draft "
     "model vocab type must match target model to use speculation",
     "failed to initialize speculative decoding context: draft model vocab type must match "
     "target model to use speculation"),
], ids=["drafter-load", "mtp-context", "speculation-refused"])
def test_speculative_errors(line: str, error: str) -> None:
    assert parse_launch_log(line).speculative_error == error


def test_a_drafter_that_failed_to_load_is_not_loaded() -> None:
    log = "\n".join([*TARGET_LOAD, DRAFT_LOAD[0],
                     "0.00.012.124 E llama_model_load: error loading model: tensor "
                     "'blk.0.ffn_gate.weight' data is not within the file bounds, model is "
                     "corrupted or incomplete",
                     f"0.00.012.127 E srv    load_model: failed to load draft model, '{DRAFTER}'"])
    report = parse_launch_log(log)
    assert report.drafter_path == DRAFTER
    assert not report.drafter_loaded


def test_the_cpu_override_warning_is_seen_at_lv4() -> None:
    log = ("0.00.009.168 W llama_model_loader: tensor overrides to CPU are used with mmap enabled"
           " - consider using --load-mode none for better performance")
    assert parse_launch_log(log).cpu_override_warning


def test_mixed_cache_types_have_no_single_type() -> None:
    swa = ("I llama_kv_cache: size =    4.97 MiB ( 13568 cells,   1 layers,  3/3 seqs), "
           "K (f16):    2.48 MiB, V (f16):    2.48 MiB")
    other = ("I llama_kv_cache: size =    0.09 MiB (   256 cells,   1 layers,  3/3 seqs), "
             "K (q8_0):    0.05 MiB, V (f16):    0.05 MiB")
    report = parse_launch_log("\n".join([TARGET_LOAD[-1], swa, other]))
    assert (report.type_k, report.type_v) == (None, "f16")


# --- planned against observed ----------------------------------------------------------------


def report_with(*, n_ctx: int = 1024, n_seq_max: int = 4, kv_unified: bool = False,
                n_batch: int = 256, n_ubatch: int = 128, n_slots: int = 4,
                flash: FlashAttnMode = FlashAttnMode.DISABLED, forced: str | None = None,
                type_k: str = "f32", offloaded: tuple[int, int] | None = None,
                overrides: tuple[TensorOverride, ...] = (),
                drafter: BlockReport | None = None, drafter_path: str | None = None,
                spec: tuple[str, ...] = (),
                draft: tuple[DraftParams, ...] = (DraftParams(3, 0, Decimal("0.000000")),),
                checkpoints: tuple[int, int | None] = (32, 8192),
                load_mode: LoadMode = LoadMode.MMAP,
                weights: tuple[str, ...] = ("CPU_Mapped",),
                mlock_failures: tuple[str, ...] = (),
                devices: tuple[str, ...] = (), kv_buffers: tuple[str, ...] = ("CPU",),
                tensor_split: int | None = None) -> LaunchReport:
    """A report like the captured CPU logs' (draft-simple's default sizes, the server's default
    checkpoints, mmap), changed where a case says so."""
    cache = block_of(
        "I llama_kv_cache: size =    0.38 MiB (   256 cells,   2 layers,  4/4 seqs), "
        f"K ({type_k}):    0.25 MiB, V (f16):    0.12 MiB").kv_caches
    target = BlockReport(
        BlockRole.TARGET, BlockKind.MODEL, DENSE, n_seq_max=n_seq_max, n_ctx=n_ctx,
        n_ctx_seq=n_ctx // n_seq_max, n_batch=n_batch, n_ubatch=n_ubatch, kv_unified=kv_unified,
        flash_attn_mode=flash, flash_attn=flash is FlashAttnMode.ENABLED,
        flash_attn_forced=forced, kv_caches=cache, offloaded_layers=offloaded,
        overrides=overrides, model_buffers=tuple(BufferSize(b, Decimal("0.41")) for b in weights),
        devices=tuple(DeviceUse(name, "a GPU", None, None) for name in devices),
        kv_buffers=tuple(BufferSize(b, Decimal("0.12")) for b in kv_buffers),
        load_mode=load_mode, tensor_split_devices=tensor_split)
    return LaunchReport(target=target, drafter=drafter, n_slots=n_slots, n_ctx_slot=256,
                        slots_kv_unified=kv_unified, drafter_path=drafter_path,
                        speculative_types=spec, speculative_ready=bool(spec),
                        speculative_error=None, cpu_override_warning=False,
                        draft_params=draft, ctx_checkpoints=checkpoints[0],
                        checkpoint_min_step=checkpoints[1], mlock_failures=mlock_failures)


#: The captured cpu/flash-attn-off run: -c 1000 -np 4 -b 256 -ub 128 -ctk f32 -fa off.
FA_OFF_PLAN = {"ctx_size": 1000, "parallel": 4, "batch_size": 256, "ubatch_size": 128,
               "cache_type_k": "f32", "cache_type_v": "f16", "flash_attn": "off"}


def test_a_plan_that_reached_the_server_has_no_mismatch() -> None:
    assert compare_launch(FA_OFF_PLAN, report_with()) == ()


def test_the_corpus_run_matches_its_plan() -> None:
    log = Path(__file__).parent / "data" / "logs" / "cpu" / "flash-attn-off.log"
    report = parse_launch_log(log.read_text(encoding="utf-8", errors="replace"))
    assert compare_launch(FA_OFF_PLAN, report) == ()


MISMATCH_CASES: dict[str, tuple[dict[str, object], dict[str, object], str, object]] = {
    # id: (planned, report overrides, field, observed)
    "ctx-shrunk": ({"ctx_size": 2048}, {}, "ctx_size", 1024),
    "fewer-slots": ({"parallel": 2}, {}, "parallel", 4),
    "batch": ({"batch_size": 512}, {}, "batch_size", 256),
    "ubatch": ({"ubatch_size": 64}, {}, "ubatch_size", 128),
    "cache-type-k": ({"cache_type_k": "q8_0"}, {}, "cache_type_k", "f32"),
    "flash-attn-on-but-off": ({"flash_attn": "on"}, {}, "flash_attn", "off"),
    "flash-attn-auto-but-on": ({"flash_attn": "auto"}, {"flash": FlashAttnMode.ENABLED},
                               "flash_attn", "on"),
    "gpu-layers-not-offloaded": ({"n_gpu_layers": 99}, {"offloaded": (0, 3)}, "n_gpu_layers", 0),
    "gpu-layers-no-gpu-line": ({"n_gpu_layers": 99}, {}, "n_gpu_layers", None),
    "drafter-missing": ({"drafter": DRAFTER}, {}, "drafter", None),
    "spec-type": ({"spec_type": "draft-mtp"}, {"spec": ("draft-simple",)}, "spec_type",
                  "draft-simple"),
    "cpu-moe-invisible-at-lv4": ({"n_cpu_moe": 1}, {}, "n_cpu_moe", None),
    "n-slots": ({"n_slots": 8}, {}, "n_slots", 4),
    "mtp-context-missing": ({"mtp_context": True}, {}, "mtp_context", False),
    # The fields below are sent by every card plan; each must be able to fail.
    "draft-n-min": ({"spec_draft_n_min": 4}, {}, "spec_draft_n_min", 0),
    "draft-n-max": ({"spec_draft_n_max": 16}, {}, "spec_draft_n_max", 3),
    "draft-p-min": ({"spec_draft_p_min": 0.5}, {}, "spec_draft_p_min", 0.0),
    "draft-p-min-at-two-decimals": ({"spec_draft_p_min": 0.13}, {"draft": (
        DraftParams(3, 0, Decimal("0.12")),)}, "spec_draft_p_min", 0.12),
    "draft-sizes-not-printed": ({"spec_draft_n_max": 16}, {"draft": ()}, "spec_draft_n_max",
                                None),
    "draft-sizes-disagree": ({"spec_draft_n_max": 3}, {"draft": (
        DraftParams(3, 0, Decimal("0.00")), DraftParams(4, 0, Decimal("0.00")))},
        "spec_draft_n_max", (3, 4)),
    "ctx-checkpoints": ({"ctx_checkpoints": 8}, {}, "ctx_checkpoints", 32),
    "ctx-checkpoints-disabled": ({"ctx_checkpoints": 8}, {"checkpoints": (0, None)},
                                 "ctx_checkpoints", 0),
    "checkpoint-min-step": ({"checkpoint_min_step": 4096}, {}, "checkpoint_min_step", 8192),
    "load-mode-none-but-mapped": ({"load_mode": "none"}, {}, "load_mode", "mmap"),
    "load-mode-echoed-but-mapped": ({"load_mode": "none"}, {"load_mode": LoadMode.NONE},
                                    "load_mode", "mmap"),
    "load-mode-mmap-but-copied": ({"load_mode": "mmap"}, {"weights": ("CPU",)}, "load_mode",
                                  "none"),
    "load-mode-mlock-refused": ({"load_mode": "mmap+mlock"}, {
        "load_mode": LoadMode.MMAP_MLOCK, "mlock_failures": (
            "warning: failed to mlock 77824-byte buffer (after previously locking 0 bytes): "
            "Operation not permitted",)}, "load_mode", "mmap"),
    "load-mode-mlock-ignored": ({"load_mode": "mlock"}, {"load_mode": LoadMode.NONE,
                                                          "weights": ("CPU",)},
                                "load_mode", "none"),
    "kv-offload-off-but-on-gpu": ({"kv_offload": False}, {
        "offloaded": (3, 3), "devices": ("CUDA0",), "kv_buffers": ("CUDA0",)}, "kv_offload",
        True),
    "kv-offload-on-but-on-cpu": ({"kv_offload": True}, {
        "offloaded": (3, 3), "devices": ("CUDA0",)}, "kv_offload", False),
    "kv-offload-no-gpu-line": ({"kv_offload": True}, {}, "kv_offload", None),
    "split-none-but-two-devices": ({"split_mode": "none"}, {"devices": ("CUDA0", "CUDA1")},
                                   "split_mode", "layer"),
    "split-tensor-but-layer": ({"split_mode": "tensor"}, {"devices": ("CUDA0", "CUDA1")},
                               "split_mode", "layer"),
    "split-layer-but-tensor": ({"split_mode": "layer"}, {"tensor_split": 2}, "split_mode",
                               "tensor"),
    "split-no-gpu-line": ({"split_mode": "none"}, {}, "split_mode", None),
    "main-gpu": ({"main_gpu": 1}, {"devices": ("CUDA0",)}, "main_gpu", 0),
    "main-gpu-with-two-devices": ({"main_gpu": 0}, {"devices": ("CUDA0", "CUDA1")}, "main_gpu",
                                  None),
}


@pytest.mark.parametrize(("planned", "observed_with", "field", "observed"),
                         MISMATCH_CASES.values(), ids=MISMATCH_CASES.keys())
def test_each_field_that_did_not_arrive_is_named(planned: dict[str, object],
                                                 observed_with: dict[str, object], field: str,
                                                 observed: object) -> None:
    (mismatch,) = compare_launch(planned, report_with(**observed_with))  # type: ignore[arg-type]
    assert (mismatch.field, mismatch.planned, mismatch.observed) == (
        field, planned[field], observed)


MATCH_CASES: list[tuple[dict[str, object], dict[str, object]]] = [
    # (planned, report overrides): the server's own adjustments of a request are not mismatches
    ({"ctx_size": 1000}, {}),  # padded to 1024, four windows of 256
    ({"ctx_size": 1000, "parallel": 4}, {"kv_unified": True}),
    ({"ctx_size": 0}, {}),  # 0 asks for the model's own length
    ({"batch_size": 4096}, {"n_batch": 1024}),  # capped by n_ctx
    ({"ubatch_size": 512}, {"n_ubatch": 256, "n_batch": 256}),  # capped by n_batch
    ({"flash_attn": "auto"}, {"flash": FlashAttnMode.ENABLED, "forced": "quantized V cache"}),
    ({"flash_attn": "on"}, {"flash": FlashAttnMode.ENABLED}),
    ({"n_gpu_layers": 99}, {"offloaded": (3, 3)}),
    ({"n_gpu_layers": 1}, {"offloaded": (1, 3)}),
    ({"n_cpu_moe": 2}, {"overrides": (
        TensorOverride("blk.1.ffn_up_exps.weight", 1, 0, "f32", "CPU"),)}),
    ({"cpu_moe": True}, {"overrides": (
        TensorOverride("blk.0.ffn_up_exps.weight", 0, 0, "f32", "CPU"),)}),
    ({"spec_type": "draft-simple", "speculative_ready": True}, {"spec": ("draft-simple",)}),
    ({"cache_type_k": None, "drafter": None}, {}),  # None is "not planned"
    ({"spec_draft_n_min": 0, "spec_draft_n_max": 3, "spec_draft_p_min": 0.0}, {}),
    # %.2f rounds the stored float as printf does: 0.125 is printed 0.12 (captured)
    ({"spec_draft_p_min": 0.125}, {"draft": (DraftParams(4, 1, Decimal("0.12")),)}),
    ({"spec_draft_p_min": 0.75}, {"draft": (DraftParams(5, 2, Decimal("0.750000")),)}),
    ({"ctx_checkpoints": 32, "checkpoint_min_step": 8192}, {}),
    ({"ctx_checkpoints": 0}, {"checkpoints": (0, None)}),
    ({"load_mode": "mmap"}, {}),
    ({"load_mode": "auto"}, {}),  # load_tensors prints what auto resolved to
    ({"load_mode": "auto"}, {"load_mode": LoadMode.NONE, "weights": ("CPU",)}),
    ({"load_mode": "none"}, {"load_mode": LoadMode.NONE, "weights": ("CPU",)}),
    ({"load_mode": "mlock"}, {"load_mode": LoadMode.MLOCK, "weights": ("CPU",)}),
    ({"load_mode": "mmap+mlock"}, {"load_mode": LoadMode.MMAP_MLOCK}),
    # a GPU build without mmap keeps the host weights in the backend's pinned buffer
    ({"load_mode": "none"}, {"load_mode": LoadMode.NONE, "weights": ("CUDA_Host", "CUDA0")}),
    ({"load_mode": "dio"}, {"load_mode": LoadMode.DIO, "weights": ("CPU",)}),
    ({"kv_offload": True}, {"offloaded": (3, 3), "devices": ("CUDA0",),
                            "kv_buffers": ("CUDA0",)}),
    # partial offload: the CPU layers keep their cache on the CPU
    ({"kv_offload": True}, {"offloaded": (2, 3), "devices": ("CUDA0",),
                            "kv_buffers": ("CPU", "CUDA0")}),
    ({"kv_offload": False}, {"offloaded": (3, 3), "devices": ("CUDA0",)}),
    # -ngl 1 offloads only the output layer: no repeating layer, so no KV, on the GPU
    ({"kv_offload": True}, {"offloaded": (1, 3), "devices": ("CUDA0",)}),
    ({"split_mode": "none", "main_gpu": 0}, {"devices": ("CUDA0",)}),
    ({"split_mode": "none", "main_gpu": 1}, {"devices": ("CUDA1",)}),
    ({"split_mode": "layer"}, {"devices": ("CUDA0",)}),  # one GPU: layer places like none
    ({"split_mode": "layer"}, {"devices": ("ROCm0", "ROCm1")}),
    ({"split_mode": "tensor"}, {"tensor_split": 2}),
    ({"split_mode": "row"}, {"devices": ("SYCL0", "SYCL1"), "weights": ("SYCL_Split",)}),
]


@pytest.mark.parametrize(("planned", "observed_with"), MATCH_CASES,
                         ids=[",".join(f"{k}={v}" for k, v in case[0].items()) for case in
                              MATCH_CASES])
def test_what_the_server_makes_of_a_request_is_no_mismatch(planned: dict[str, object],
                                                           observed_with: dict[str, object]
                                                           ) -> None:
    assert compare_launch(planned, report_with(**observed_with)) == ()  # type: ignore[arg-type]


def test_override_blocks_beyond_the_planned_count_are_a_mismatch() -> None:
    late = TensorOverride("blk.3.ffn_up_exps.weight", 3, 0, "f32", "CPU")
    report = report_with(overrides=(late,))
    (mismatch,) = compare_launch({"n_cpu_moe": 2}, report)
    assert mismatch.observed == (3,)


def test_a_loaded_drafter_matches_its_path() -> None:
    drafter = BlockReport(BlockRole.DRAFTER, BlockKind.MODEL, DRAFTER,
                          model_buffers=(BufferSize("CPU_Mapped", Decimal("0.10")),), n_ctx=1024)
    report = report_with(drafter=drafter, drafter_path=DRAFTER, spec=("draft-simple",))
    assert compare_launch({"drafter": Path(DRAFTER), "drafter_loaded": True}, report) == ()


@pytest.mark.parametrize(("ctx", "n_seq", "unified", "n_ctx"), [
    (512, 1, False, 512),
    (1000, 4, False, 1024),
    (1000, 4, True, 1024),
    (2048, 3, False, 2304),  # 2048/3 = 682 -> 768 per sequence
    (100000, 1, False, 100096),
], ids=str)
def test_applied_n_ctx_pads_like_llama_context(ctx: int, n_seq: int, unified: bool,
                                               n_ctx: int) -> None:
    assert applied_n_ctx(ctx, n_seq, unified) == n_ctx


def test_an_unknown_field_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown field\(s\) ctx.*known: .*ctx_size"):
        compare_launch({"ctx": 512}, report_with())
    assert "ctx_size" in comparable_fields()


def test_a_non_integer_count_is_refused() -> None:
    with pytest.raises(TypeError, match="ctx_size must be an int"):
        compare_launch({"ctx_size": "512"}, report_with())


def test_a_mismatch_names_field_planned_and_observed() -> None:
    text = str(Mismatch("ctx_size", 2000, 1024, "the server makes it n_ctx 2048"))
    assert text == "ctx_size: planned 2000, observed 1024 (the server makes it n_ctx 2048)"


# --- the new fields on the captured logs -------------------------------------------------------

CPU_LOGS = Path(__file__).parent / "data" / "logs" / "cpu"

#: Captured log → the flags it was started with (its sidecar's argv), as compare_launch keys.
CAPTURED_PLANS: dict[str, dict[str, object]] = {
    "spec-draft-params": {"spec_type": "draft-simple", "drafter": Path(DRAFTER),
                          "spec_draft_n_min": 2, "spec_draft_n_max": 5,
                          "spec_draft_p_min": 0.75},
    "mtp-draft-params": {"spec_type": "draft-mtp", "mtp_context": True, "spec_draft_n_min": 1,
                         "spec_draft_n_max": 4, "spec_draft_p_min": 0.125},
    "checkpoints": {"ctx_checkpoints": 5, "checkpoint_min_step": 64},
    "checkpoints-off": {"ctx_checkpoints": 0},
    "load-mode-none": {"load_mode": "none"},
    "load-mode-mlock": {"load_mode": "mlock"},
    "load-mode-mmap-mlock": {"load_mode": "mmap+mlock"},
    "flash-attn-off": {"load_mode": "auto", "ctx_checkpoints": 32,
                       "checkpoint_min_step": 8192},
}


def _captured(name: str) -> LaunchReport:
    text = (CPU_LOGS / f"{name}.log").read_text(encoding="utf-8", errors="replace")
    return parse_launch_log(text)


@pytest.mark.parametrize("name", CAPTURED_PLANS)
def test_a_captured_run_matches_the_flags_it_was_given(name: str) -> None:
    planned = dict(CAPTURED_PLANS[name])
    if "drafter" in planned:
        # The corpus was captured from another fixture cache; the path is the report's.
        planned["drafter"] = Path(str(_captured(name).drafter_path))
    assert compare_launch(planned, _captured(name)) == ()


#: Captured log, a planned value it contradicts, and what the server reported instead.
CAPTURED_MISMATCHES = [
    ("spec-draft-params", "spec_draft_n_min", 3, 2),
    ("spec-draft-params", "spec_draft_n_max", 8, 5),
    ("spec-draft-params", "spec_draft_p_min", 0.5, 0.75),
    ("mtp-draft-params", "spec_draft_p_min", 0.25, 0.12),
    ("checkpoints", "ctx_checkpoints", 8, 5),
    ("checkpoints", "checkpoint_min_step", 8192, 64),
    ("checkpoints-off", "ctx_checkpoints", 16, 0),
    ("checkpoints", "spec_draft_n_max", 16, None),  # no drafter: nothing printed the sizes
    ("load-mode-none", "load_mode", "mmap", "none"),
    ("load-mode-mlock", "load_mode", "mmap+mlock", "mlock"),
    ("load-mode-mmap-mlock", "load_mode", "none", "mmap+mlock"),
    ("mlock-denied", "load_mode", "mmap+mlock", "mmap"),
    ("flash-attn-off", "load_mode", "none", "mmap"),
    # the CPU build shows no GPU device, so these are never confirmed there
    ("no-kv-offload", "kv_offload", False, None),
    ("no-kv-offload", "split_mode", "none", None),
    ("no-kv-offload", "main_gpu", 0, None),
]


@pytest.mark.parametrize(("name", "field", "planned", "observed"), CAPTURED_MISMATCHES,
                         ids=[f"{c[0]}:{c[1]}={c[2]}" for c in CAPTURED_MISMATCHES])
def test_a_captured_run_contradicts_a_different_plan(name: str, field: str, planned: object,
                                                     observed: object) -> None:
    (mismatch,) = compare_launch({field: planned}, _captured(name))
    assert (mismatch.field, mismatch.planned, mismatch.observed) == (field, planned, observed)
    assert str(mismatch).startswith(f"{field}: planned {planned!r}, observed {observed!r}")


def test_a_refused_mlock_is_named_in_the_mismatch() -> None:
    (mismatch,) = compare_launch({"load_mode": "mmap+mlock"}, _captured("mlock-denied"))
    assert "failed to mlock 77824-byte buffer" in mismatch.detail
    assert "Operation not permitted" in mismatch.detail


def test_the_draft_sizes_are_read_from_every_draft_implementation() -> None:
    assert _captured("spec-draft-params").draft_params == (DraftParams(5, 2, Decimal("0.750000")),)
    assert _captured("mtp-draft-params").draft_params == (DraftParams(4, 1, Decimal("0.12")),)
    # the ngram implementations print their own n_max/n_min without p_min: not draft sizes
    ngram = "0.00.015.254 I spec common_specu: - n_match=4, n_max=16, n_min=2"
    assert parse_launch_log(ngram).draft_params == ()


def test_disabled_checkpoints_have_no_spacing() -> None:
    report = _captured("checkpoints-off")
    assert (report.ctx_checkpoints, report.checkpoint_min_step) == (0, None)
    (mismatch,) = compare_launch({"checkpoint_min_step": 64}, report)
    assert mismatch.observed is None
    assert "disabled" in mismatch.detail


def test_the_cpu_build_cannot_show_the_gpu_fields() -> None:
    planned = {"ctx_size": 512, "n_gpu_layers": 999, "split_mode": "none", "main_gpu": 0,
               "kv_offload": True, "load_mode": "mmap+mlock", "ctx_checkpoints": 8,
               "spec_type": "draft-simple", "spec_draft_n_max": 16}
    assert unverifiable(planned, Backend.CPU) == dict(CPU_UNVERIFIABLE)
    # a GPU build shows them all for this plan
    assert unverifiable(planned, Backend.CUDA) == {}
    # an unplanned field is not listed
    assert "kv_offload" not in unverifiable({"kv_offload": None}, Backend.CPU)


@pytest.mark.parametrize(("planned", "field", "reason"), [
    ({"spec_type": "none", "spec_draft_n_min": 4}, "spec_draft_n_min", "runs no draft-*"),
    ({"spec_draft_p_min": 0.5}, "spec_draft_p_min", "spec type none"),
    ({"spec_type": "ngram-mod", "spec_draft_n_max": 16}, "spec_draft_n_max", "ngram-mod"),
    ({"ctx_checkpoints": 0, "checkpoint_min_step": 64}, "checkpoint_min_step", "disables"),
    ({"split_mode": "layer", "main_gpu": 1}, "main_gpu", "only with --split-mode none"),
    ({"main_gpu": 1}, "main_gpu", "layer (default)"),
], ids=["spec-none", "no-spec-type", "ngram", "no-checkpoints", "layer-split", "default-split"])
def test_a_plan_can_make_a_field_unobservable_on_any_build(planned: dict[str, object],
                                                           field: str, reason: str) -> None:
    for backend in Backend:
        found = unverifiable(planned, backend)
        # On the CPU build a GPU field's first reason is that there is no GPU at all.
        assert field in found, (backend, found)
        assert reason in found[field] or found[field] == CPU_UNVERIFIABLE.get(field), found


def test_observable_fields_are_not_called_unverifiable() -> None:
    planned = {"spec_type": "draft-simple,ngram-mod", "spec_draft_n_min": 4,
               "ctx_checkpoints": 4, "checkpoint_min_step": 64, "load_mode": "none",
               "split_mode": "none", "main_gpu": 0}
    assert set(unverifiable(planned, Backend.CPU)) == {"split_mode", "main_gpu"}
    assert unverifiable(planned, Backend.VULKAN) == {}
