"""The GPU-use verdict (``harness/verdicts/gpu_use.py``), one signal at a time.

The logs are short excerpts: CPU lines captured from the pinned CPU build; GPU lines
written from the pinned source's format strings (function named beside each); the Vulkan
lines quoted from docs/design.md's measurements. ``tests/test_log_corpus.py`` runs the same
verdict over whole logs.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from harness.facts.build import Backend
from harness.verdicts.block_report import BufferSize
from harness.verdicts.gpu_signals import GpuBackend
from harness.verdicts.gpu_use import (
    GpuState,
    SoftwareDevice,
    gpu_backend_of,
    gpu_verdict,
    parse_expected_backend,
    software_device,
)
from harness.verdicts.log_blocks import BlockRole

DRAFTER = "/root/.cache/llama-harness/fixtures/ab425a6bb1be3f5e/models/drafter.gguf"
DENSE = "/root/.cache/llama-harness/fixtures/ab425a6bb1be3f5e/models/dense.gguf"

# Captured (CPU build, dense fixture, -lv 4).
LOADER = (f"0.00.005.928 I llama_model_loader: loaded meta data with 19 key-value pairs and 21 "
          f"tensors from {DENSE} (version GGUF V3 (latest))")
CPU_WEIGHTS = "0.00.006.446 I load_tensors:   CPU_Mapped model buffer size =     0.41 MiB"
CPU_KV = "0.00.006.615 I llama_kv_cache:        CPU KV buffer size =     0.50 MiB"
NO_USABLE_GPU = "warning: no usable GPU found, --gpu-layers option will be ignored"
SLOTS = ("0.00.039.138 I srv    load_model: initializing, n_slots = 2, n_ctx_slot = 1024, "
         "kv_unified = 'false'")
# src/llama.cpp llama_prepare_model_devices
USING_CUDA0 = ("0.00.008.017 I llama_prepare_model_devices: using device CUDA0 (NVIDIA GeForce "
               "RTX 4090) (0000:01:00.0) - 23592 MiB free")
USING_LLVMPIPE = ("0.00.008.017 I llama_prepare_model_devices: using device Vulkan0 (llvmpipe "
                  "(LLVM 19.1.7, 256 bits)) (unknown id) - 24105 MiB free")
USING_VULKAN0 = ("0.00.008.017 I llama_prepare_model_devices: using device Vulkan0 (AMD Radeon "
                 "RX 7900 XTX (RADV NAVI31)) (0000:03:00.0) - 24304 MiB free")
# src/llama-model.cpp load_tensors
OFFLOADED_3 = "0.00.008.356 I load_tensors: offloaded 3/3 layers to GPU"
OFFLOADED_0 = "0.00.008.356 I load_tensors: offloaded 0/3 layers to GPU"
OFFLOADED_1 = "0.00.008.356 I load_tensors: offloaded 1/3 layers to GPU"
CPU_INPUT = "0.00.008.642 I load_tensors:   CPU_Mapped model buffer size =     0.07 MiB"
CUDA0_WEIGHTS = "0.00.008.642 I load_tensors:        CUDA0 model buffer size =     0.35 MiB"
VULKAN0_WEIGHTS = "0.00.008.642 I load_tensors:      Vulkan0 model buffer size =     0.35 MiB"
ROCM0_WEIGHTS = "0.00.008.642 I load_tensors:        ROCm0 model buffer size =     0.35 MiB"
CUDA0_EMPTY = "0.00.006.718 I load_tensors:        CUDA0 model buffer size =     0.00 MiB"
# ggml/src/ggml-cuda/ggml-cuda.cu ggml_cuda_init
CUDA_INIT_FAILED = ("0.00.003.306 E ggml_cuda_init: failed to initialize CUDA: no CUDA-capable "
                    "device is detected")
ROCM_INIT_FAILED = ("0.00.003.306 E ggml_cuda_init: failed to initialize ROCm: no ROCm-capable "
                    "device is detected")
# ggml/src/ggml-vulkan/ggml-vulkan.cpp ggml_vk_instance_init
VK_NO_DEVICES = "0.00.003.306 I ggml_vulkan: No devices found."
# -lv 5 override line to the GPU (src/llama-model-loader.cpp)
OVERRIDE_TO_CUDA = ("0.00.009.170 D tensor output.weight (0 MiB f32) buffer type overridden to "
                    "CUDA0")

CPU_RUN = [LOADER, CPU_WEIGHTS, CPU_KV, SLOTS]
CUDA_RUN = [LOADER, USING_CUDA0, OFFLOADED_3, CPU_INPUT, CUDA0_WEIGHTS, SLOTS]


def log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


# --- vocabulary ------------------------------------------------------------------------------


@pytest.mark.parametrize(("word", "backend"), [
    (None, None), ("cpu", None), ("cuda", GpuBackend.CUDA), ("CUDA", GpuBackend.CUDA),
    ("rocm", GpuBackend.ROCM), ("ROCm", GpuBackend.ROCM), ("hip", GpuBackend.ROCM),
    ("vulkan", GpuBackend.VULKAN), ("sycl", GpuBackend.SYCL), ("metal", GpuBackend.METAL),
    (Backend.CUDA, GpuBackend.CUDA), (Backend.CPU, None), (GpuBackend.VULKAN, GpuBackend.VULKAN),
], ids=str)
def test_expected_backend_words(word: str | None, backend: GpuBackend | None) -> None:
    assert parse_expected_backend(word) is backend


def test_an_unknown_backend_is_refused_with_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'opencl'; known: .*cuda"):
        gpu_verdict("", "opencl")


@pytest.mark.parametrize(("name", "backend"), [
    ("CUDA0", GpuBackend.CUDA), ("CUDA1", GpuBackend.CUDA), ("ROCm0", GpuBackend.ROCM),
    ("Vulkan0", GpuBackend.VULKAN), ("SYCL0", GpuBackend.SYCL), ("MTL0", GpuBackend.METAL),
    ("CUDA_Split", GpuBackend.CUDA), ("CUDA_Host", None), ("Vulkan_Host", None),
    ("CPU_Mapped", None), ("CPU", None), ("CPU_REPACK", None),
], ids=str)
def test_buffer_and_device_names(name: str, backend: GpuBackend | None) -> None:
    assert gpu_backend_of(name) is backend


@pytest.mark.parametrize(("description", "device"), [
    ("llvmpipe (LLVM 19.1.7, 256 bits)", SoftwareDevice.LLVMPIPE),
    ("lavapipe", SoftwareDevice.LAVAPIPE),
    ("SwiftShader Device (Subzero)", SoftwareDevice.SWIFTSHADER),
    ("NVIDIA GeForce RTX 4090", None),
    (None, None),
], ids=str)
def test_software_devices(description: str | None, device: SoftwareDevice | None) -> None:
    assert software_device(description) is device


# --- one verdict per signal ------------------------------------------------------------------

STATE_CASES: dict[str, tuple[list[str], str | None, GpuState, bool]] = {
    # id: (log lines, expected backend, target state, passed)
    "cpu-build": (CPU_RUN, None, GpuState.NO_GPU_EXPECTED, True),
    "cpu-build-with-ngl": ([NO_USABLE_GPU, *CPU_RUN], "cpu", GpuState.NO_GPU_EXPECTED, True),
    "cuda-expected-on-cpu-log": (CPU_RUN, "cuda", GpuState.NOT_LOADED, False),
    "cuda-used": (CUDA_RUN, "cuda", GpuState.USED, True),
    "rocm-used": ([LOADER, OFFLOADED_3, CPU_INPUT, ROCM0_WEIGHTS], "rocm", GpuState.USED, True),
    "vulkan-used": ([LOADER, USING_VULKAN0, VULKAN0_WEIGHTS], "vulkan", GpuState.USED, True),
    "cuda-init-failed": ([CUDA_INIT_FAILED, NO_USABLE_GPU, *CPU_RUN], "cuda",
                         GpuState.INIT_FAILED, False),
    "rocm-init-failed": ([ROCM_INIT_FAILED, *CPU_RUN], "rocm", GpuState.INIT_FAILED, False),
    "cuda-init-failure-on-a-rocm-build": ([CUDA_INIT_FAILED, *CPU_RUN], "rocm",
                                          GpuState.NOT_LOADED, False),
    "vulkan-no-devices": ([VK_NO_DEVICES, NO_USABLE_GPU, *CPU_RUN], "vulkan",
                          GpuState.NO_DEVICES, False),
    "vulkan-no-usable-gpu": ([NO_USABLE_GPU, *CPU_RUN], "vulkan", GpuState.NO_USABLE_GPU, False),
    "software-device": ([LOADER, USING_LLVMPIPE, OFFLOADED_3, VULKAN0_WEIGHTS], "vulkan",
                        GpuState.SOFTWARE_DEVICE, False),
    "not-offloaded": ([LOADER, USING_CUDA0, OFFLOADED_0, CPU_WEIGHTS], "cuda",
                      GpuState.NOT_OFFLOADED, False),
    "zero-mib-gpu-buffer": ([LOADER, USING_CUDA0, CPU_WEIGHTS, CUDA0_EMPTY], "cuda",
                            GpuState.NOT_OFFLOADED, False),
    "weights-on-another-backend": ([LOADER, USING_VULKAN0, VULKAN0_WEIGHTS], "cuda",
                                   GpuState.NOT_LOADED, False),
    "empty-log": ([], "cuda", GpuState.UNDECIDABLE, False),
    "ends-before-the-buffers": ([LOADER, USING_CUDA0], "cuda", GpuState.UNDECIDABLE, False),
    # At -lv 3 only warnings and errors are printed: nothing to decide from.
    "written-below-lv4": (["0.00.002.484 W srv  llama_server: security: no API key is set"],
                          "cuda", GpuState.UNDECIDABLE, False),
}


@pytest.mark.parametrize(("lines", "backend", "state", "passed"), STATE_CASES.values(),
                         ids=STATE_CASES.keys())
def test_the_target_state(lines: list[str], backend: str | None, state: GpuState,
                          passed: bool) -> None:
    verdict = gpu_verdict(log(*lines), backend)
    target = verdict.block(BlockRole.TARGET)
    assert target is not None
    assert (target.state, verdict.passed) == (state, passed), verdict.reason
    if not passed:
        assert verdict.reason.startswith(f"target: {state.value} — ")


def test_used_names_the_device_and_its_buffers() -> None:
    verdict = gpu_verdict(log(*CUDA_RUN), "cuda")
    (target,) = verdict.blocks
    assert (target.device, target.device_description, target.backend) == (
        "CUDA0", "NVIDIA GeForce RTX 4090", GpuBackend.CUDA)
    assert target.buffers_mib == (BufferSize("CUDA0", Decimal("0.35")),)
    assert target.gpu_mib == {"CUDA0": Decimal("0.35")}
    assert (target.offloaded_layers, target.offload_mismatch, target.warnings) == ((3, 3), False,
                                                                                  ())
    assert verdict.reason == ("target on CUDA0 (NVIDIA GeForce RTX 4090): weights CUDA0 0.35 MiB")


def test_init_failure_keeps_the_engines_words() -> None:
    (target,) = gpu_verdict(log(CUDA_INIT_FAILED, *CPU_RUN), "cuda").blocks
    assert target.detail == "no CUDA-capable device is detected"


def test_a_software_device_passes_when_allowed() -> None:
    lines = log(LOADER, USING_LLVMPIPE, VULKAN0_WEIGHTS)
    assert gpu_verdict(lines, "vulkan", allow_software_device=True).passed
    assert "llvmpipe" in gpu_verdict(lines, "vulkan").reason


def test_offloaded_layers_without_gpu_buffers_are_a_mismatch() -> None:
    (target,) = gpu_verdict(log(LOADER, USING_CUDA0, OFFLOADED_3, CPU_WEIGHTS), "cuda").blocks
    assert (target.state, target.offload_mismatch) == (GpuState.NOT_OFFLOADED, True)
    assert target.warnings == ("target: the log says 'offloaded 3/3 layers to GPU' but shows no "
                               "CUDA buffer",)


@pytest.mark.parametrize(("first", "backend", "state"), [
    pytest.param(CUDA_INIT_FAILED, "cuda", GpuState.INIT_FAILED, id="cuda-init-failed"),
    pytest.param(ROCM_INIT_FAILED, "rocm", GpuState.INIT_FAILED, id="rocm-init-failed"),
    pytest.param(VK_NO_DEVICES, "vulkan", GpuState.NO_DEVICES, id="vulkan-no-devices"),
    pytest.param(NO_USABLE_GPU, "cuda", GpuState.NO_USABLE_GPU, id="no-usable-gpu"),
    pytest.param(LOADER, "cuda", GpuState.NOT_LOADED, id="not-loaded"),
])
def test_offloaded_layers_are_a_mismatch_in_every_state_without_gpu_buffers(
        first: str, backend: str, state: GpuState) -> None:
    # The GPU never came up, yet the log counts layers on it: the count is wrong.
    (target,) = gpu_verdict(log(first, LOADER, OFFLOADED_3, CPU_WEIGHTS), backend).blocks
    assert (target.state, target.offload_mismatch) == (state, True)
    assert any("offloaded 3/3 layers to GPU' but shows no" in w for w in target.warnings)


def test_offloaded_layers_on_another_gpu_are_not_a_mismatch() -> None:
    # Expected CUDA, the weights went to Vulkan0: the count is right, the backend wrong.
    lines = log(LOADER, USING_LLVMPIPE, OFFLOADED_3, VULKAN0_WEIGHTS)
    (target,) = gpu_verdict(lines, "cuda").blocks
    assert (target.state, target.offload_mismatch) == (GpuState.NOT_LOADED, False)


def test_gpu_weights_with_zero_layers_offloaded_are_a_mismatch() -> None:
    (target,) = gpu_verdict(log(LOADER, USING_CUDA0, OFFLOADED_0, CUDA0_WEIGHTS), "cuda").blocks
    assert (target.state, target.offload_mismatch) == (GpuState.USED, True)


def test_a_tensor_override_to_the_gpu_explains_zero_layers() -> None:
    lines = log(LOADER, USING_CUDA0, OVERRIDE_TO_CUDA, OFFLOADED_0, CUDA0_WEIGHTS)
    (target,) = gpu_verdict(lines, "cuda").blocks
    assert (target.state, target.offload_mismatch) == (GpuState.USED, False)


def test_partial_offload_passes_with_a_warning() -> None:
    verdict = gpu_verdict(log(LOADER, USING_CUDA0, OFFLOADED_1, CPU_WEIGHTS, CUDA0_WEIGHTS),
                          "cuda")
    assert verdict.passed
    assert verdict.warnings == ("target: partial offload, 1/3 layers on the GPU",)


def test_an_allocation_failure_shows_the_gpu_was_reached() -> None:
    # ggml_backend_cuda_buffer_type_alloc_buffer, then llama_model_load's error: no buffer line.
    lines = log(LOADER, USING_CUDA0,
                "0.00.005.027 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 0.07 MiB "
                "on device 0: cudaMalloc failed: out of memory",
                "0.00.005.027 E llama_model_load: error loading model: unable to allocate CUDA0 "
                "buffer")
    verdict = gpu_verdict(lines, "cuda")
    (target,) = verdict.blocks
    assert target.state is GpuState.USED
    assert "cudaMalloc failed: out of memory" in target.warnings[0]


def test_the_fit_dry_run_does_not_count() -> None:
    # At -lv 5 --fit's no_alloc load prints its own using-device and buffer lines
    # (common/fit.cpp); only the real load after it decides.
    lines = log("0.00.003.982 I cmn  common_init_: fitting params to device memory ...",
                USING_CUDA0, OFFLOADED_3, CUDA0_WEIGHTS,
                "0.00.005.823 I common_fit_params: fitting params to free memory took 0.00 "
                "seconds",
                LOADER, USING_CUDA0, OFFLOADED_0, CPU_WEIGHTS, SLOTS)
    (target,) = gpu_verdict(lines, "cuda").blocks
    assert (target.state, target.offloaded_layers) == (GpuState.NOT_OFFLOADED, (0, 3))


def test_a_cpu_build_with_gpu_buffers_warns() -> None:
    verdict = gpu_verdict(log(*CUDA_RUN), None)
    assert verdict.passed
    assert verdict.warnings == ("target: CUDA0 holds 0.35 MiB though no GPU was expected",)


# --- the drafter, separately -----------------------------------------------------------------

LOAD_DRAFT = f"0.00.011.270 I common_speculative_init_result: loading draft model '{DRAFTER}'"
DRAFT_ON_CUDA = [LOAD_DRAFT, USING_CUDA0,
                 "0.00.037.307 I load_tensors: offloaded 2/2 layers to GPU",
                 "0.00.037.519 I load_tensors:   CPU_Mapped model buffer size =     0.03 MiB",
                 "0.00.037.519 I load_tensors:        CUDA0 model buffer size =     0.07 MiB"]
DRAFT_ON_CPU = [LOAD_DRAFT, USING_CUDA0,
                "0.00.037.307 I load_tensors: offloaded 0/2 layers to GPU",
                "0.00.037.519 I load_tensors:   CPU_Mapped model buffer size =     0.10 MiB"]
MTP_ON_CUDA = [f"0.00.013.955 I common_speculative_init_result: creating MTP draft context "
               f"against the target model '{DENSE}'",
               "0.00.014.075 I llama_kv_cache:      CUDA0 KV buffer size =     0.12 MiB",
               "0.00.015.570 I sched_reserve:      CUDA0 compute buffer size =     1.51 MiB"]
MTP_ON_CPU = [MTP_ON_CUDA[0],
              "0.00.014.075 I llama_kv_cache:        CPU KV buffer size =     0.12 MiB",
              "0.00.015.570 I sched_reserve:        CPU compute buffer size =     1.51 MiB"]

DRAFTER_CASES: dict[str, tuple[list[str], GpuState, bool]] = {
    "draft-model-on-gpu": (DRAFT_ON_CUDA, GpuState.USED, True),
    "draft-model-on-cpu": (DRAFT_ON_CPU, GpuState.NOT_OFFLOADED, False),
    "mtp-context-on-gpu": (MTP_ON_CUDA, GpuState.USED, True),
    # The MTP context loads no model: the target's using-device line names the GPU.
    "mtp-context-on-cpu": (MTP_ON_CPU, GpuState.NOT_OFFLOADED, False),
    "draft-load-cut-short": ([LOAD_DRAFT], GpuState.UNDECIDABLE, False),
}


@pytest.mark.parametrize(("drafter", "state", "passed"), DRAFTER_CASES.values(),
                         ids=DRAFTER_CASES.keys())
def test_the_drafter_is_judged_on_its_own(drafter: list[str], state: GpuState,
                                          passed: bool) -> None:
    verdict = gpu_verdict(log(*CUDA_RUN[:-1], *drafter, SLOTS), "cuda")
    target, draft = verdict.blocks
    assert (target.state, draft.role, draft.state, verdict.passed) == (
        GpuState.USED, BlockRole.DRAFTER, state, passed)
    if not passed:
        assert verdict.reason.startswith(f"drafter: {state.value}")


def test_a_draft_only_warning_leaves_the_target_alone() -> None:
    # common/arg.cpp, the --gpu-layers-draft handler
    warning = "warning: no usable GPU found, --gpu-layers-draft option will be ignored"
    verdict = gpu_verdict(log(warning, *CUDA_RUN[:-1], LOAD_DRAFT, SLOTS), "cuda")
    target, draft = verdict.blocks
    assert (target.state, draft.state) == (GpuState.USED, GpuState.NO_USABLE_GPU)


@pytest.mark.parametrize(("expected", "state"), [
    pytest.param("cuda", GpuState.NOT_LOADED, id="cuda-build-features-absent"),
    pytest.param("rocm", GpuState.NOT_LOADED, id="rocm-build-features-absent"),
    # Vulkan registers no features, so its missing backend and a missing driver look alike.
    pytest.param("vulkan", GpuState.NO_USABLE_GPU, id="vulkan-undistinguishable"),
])
def test_a_cpu_build_asked_for_a_gpu_is_judged_by_its_system_info(expected: str,
                                                                 state: GpuState) -> None:
    log = (Path(__file__).parent / "data" / "logs" / "cpu" / "no-usable-gpu.log").read_text()
    verdict = gpu_verdict(log, expected)
    assert not verdict.passed
    assert {b.state for b in verdict.blocks} == {state}
    if state is GpuState.NOT_LOADED:
        assert "system_info lists no" in verdict.blocks[0].explanation
