"""Each failure class from the lines a real llama-server printed, and the precedence rules.

The excerpts were captured from the pinned CPU build (timestamps as printed), except the
GPU out-of-memory lines: the CUDA/ROCm ones are composed from the pinned source's format
strings (the OOM injector prints the same), the Vulkan ones are docs/design.md's measurement
on a llvmpipe device.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.verdicts.failure import FIXES, FailureClass, StartFailure, classify_start_failure

CORRUPT = "/fixtures/models/drafter-corrupt.gguf"

#: dense + --spec-draft-model drafter-corrupt.gguf: --fit's probe warns first, then the
#: drafter's load fails through the same loader as the target (exit 1).
DRAFTER_LOAD_LOG = f"""\
0.00.006.188 I operator(): getting device memory data for the extra model at a context size of 512:
0.00.006.378 E llama_model_load: error loading model: tensor 'blk.0.ffn_gate.weight' data is not within the file bounds, model is corrupted or incomplete
0.00.006.392 E llama_model_load_from_file_impl: failed to load model
0.00.006.414 W operator(): failed to measure the memory of the extra model, fitting without it: failed to load model
0.00.009.059 I common_speculative_init_result: loading draft model '{CORRUPT}'
0.00.009.170 E llama_model_load: error loading model: tensor 'blk.0.ffn_gate.weight' data is not within the file bounds, model is corrupted or incomplete
0.00.009.172 E llama_model_load_from_file_impl: failed to load model
0.00.009.172 E common_speculative_init_result: failed to load draft model, '{CORRUPT}'
0.00.009.173 E srv    load_model: failed to load draft model, '{CORRUPT}'
0.00.009.177 I srv    operator(): operator(): cleaning up before exit...
0.00.014.117 E srv  llama_server: exiting due to model loading error
"""  # noqa: E501

#: dense + --spec-type draft-mtp (exit 1).
MTP_CONTEXT_LOG = """\
0.00.006.361 W operator(): failed to measure the memory of the extra model, fitting without it: failed to create llama_context from model
0.00.008.856 I common_speculative_init_result: creating MTP draft context against the target model '/fixtures/models/dense.gguf'
0.00.008.861 W llama_init_from_model: context type MTP requested but model doesn't contain MTP layers
0.00.008.861 E common_speculative_init_result: failed to create MTP context
0.00.008.862 E srv    load_model: failed to create MTP context
0.00.016.803 E srv  llama_server: exiting due to model loading error
"""  # noqa: E501

#: A CUDA build whose weights do not fit (ggml-cuda.cu, ggml-backend.cpp, llama-model.cpp,
#: llama.cpp, common.cpp, server-context.cpp: see harness/supervise/oom_injector.py).
CUDA_OOM_LOG = """\
0.00.120.017 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 6144.00 MiB on device 0: cudaMalloc failed: out of memory
0.00.121.117 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer of size 6442450944
0.00.122.217 E llama_model_load: error loading model: unable to allocate CUDA0 buffer
0.00.123.317 E llama_model_load_from_file_impl: failed to load model
0.00.124.417 E cmn  common_init_: failed to load model '/models/big.gguf'
0.00.125.517 E srv    load_model: failed to load model, '/models/big.gguf'
0.00.127.717 E srv  llama_server: exiting due to model loading error
"""  # noqa: E501

#: The same on a ROCm build: HIP compiles ggml-cuda.cu, the buffer type is ROCm0.
ROCM_OOM_LOG = """\
0.00.120.017 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 6144.00 MiB on device 0: cudaMalloc failed: out of memory
0.00.121.117 E ggml_backend_buft_alloc_buffer_n_default: failed to allocate ROCm0 buffer of size 6442450944
0.00.122.217 E llama_model_load: error loading model: unable to allocate ROCm0 buffer
"""  # noqa: E501

#: A CUDA OOM inside a kernel: ggml_cuda_error's first line, then GGML_ABORT (SIGABRT).
CUDA_ERROR_OOM_LOG = """\
0.01.204.331 E CUDA error: out of memory
llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:109: CUDA error
"""

#: docs/design.md: --fit off -ngl 99 -c 120000000 on llvmpipe (Vulkan), exit 1 after ~12 s.
VULKAN_OOM_LOG = """\
ggml_vulkan: Device memory allocation of size 7680000000 failed.
ggml_vulkan: Requested buffer size exceeds device buffer size limit: ErrorOutOfDeviceMemory
0.00.012.114 E alloc_tensor_range: failed to allocate Vulkan0 buffer of size 7680000000
"""

#: --bogus-flag: common_params_parse prints the exception text and the server returns 1.
UNKNOWN_FLAG_LOG = "error: invalid argument: --bogus-flag\n"

#: A text file as --model: the --fit probe fails first, then the real load (exit 1).
MODEL_LOAD_LOG = """\
0.00.004.090 E gguf_init_from_reader: invalid magic characters: 'not ', expected 'GGUF'
0.00.004.176 E llama_model_load: error loading model: llama_model_loader: failed to load model from notgguf.txt
0.00.004.188 E llama_model_load_from_file_impl: failed to load model
0.00.004.216 E common_fit_params: encountered an error while trying to fit params to free device memory: failed to load model
0.00.004.269 E cmn  common_init_: failed to load model 'notgguf.txt'
0.00.004.270 E srv    load_model: failed to load model, 'notgguf.txt'
0.00.004.716 E srv  llama_server: exiting due to model loading error
"""  # noqa: E501

#: glm4moe without its nextn tensors + --spec-type draft-mtp: a GGML_ASSERT, SIGABRT (-6).
ASSERT_LINE = ('llama.cpp/src/models/glm4-moe.cpp:147: GGML_ASSERT(layer.nextn.eh_proj && '
               '"MTP block missing nextn.eh_proj") failed')
CRASH_LOG = f"""\
0.00.008.428 I operator(): getting device memory data for the extra model at a context size of 512:
{ASSERT_LINE}
[New LWP 15228]
#2  0x000055d1f48b13c8 in ggml_abort ()
"""

#: A FIFO as --model: the server blocks in --fit's probe reading it.
FIFO_LINE = ("0.00.004.460 I common_params_fit_impl: getting device memory data for initial "
             "parameters:")
TIMEOUT_LOG = f"""\
0.00.004.377 I srv    load_model: loading model 'fifo'
0.00.004.401 I cmn  common_init_: fitting params to device memory ...
{FIFO_LINE}
"""

#: --flash-attn bogus: a known flag with a bad value (exit 1).
BAD_VALUE_LINE = ("error while handling argument \"--flash-attn\": error: unknown value for "
                  "--flash-attn: 'bogus'")
BAD_VALUE_LOG = f"""\
{BAD_VALUE_LINE}


usage:
-fa,   --flash-attn [on|off|auto]       set Flash Attention use ('on', 'off', or 'auto', default: 'auto')

to show complete usage, run with -h
"""  # noqa: E501


@pytest.mark.parametrize(("exit_code", "log", "timed_out", "kind", "evidence"), [
    pytest.param(1, DRAFTER_LOAD_LOG, False, FailureClass.DRAFTER_LOAD,
                 "0.00.009.172 E common_speculative_init_result: failed to load draft model, "
                 f"'{CORRUPT}'", id="drafter-load-corrupt-drafter"),
    pytest.param(1, MTP_CONTEXT_LOG, False, FailureClass.MTP_CONTEXT,
                 "0.00.008.861 E common_speculative_init_result: failed to create MTP context",
                 id="mtp-context-dense-model"),
    pytest.param(1, CUDA_OOM_LOG, False, FailureClass.OUT_OF_MEMORY,
                 "0.00.120.017 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating "
                 "6144.00 MiB on device 0: cudaMalloc failed: out of memory",
                 id="out-of-memory-cuda-weights"),
    pytest.param(1, ROCM_OOM_LOG, False, FailureClass.OUT_OF_MEMORY,
                 "0.00.120.017 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating "
                 "6144.00 MiB on device 0: cudaMalloc failed: out of memory",
                 id="out-of-memory-rocm-weights"),
    pytest.param(-6, CUDA_ERROR_OOM_LOG, False, FailureClass.OUT_OF_MEMORY,
                 "0.01.204.331 E CUDA error: out of memory", id="out-of-memory-cuda-abort"),
    pytest.param(1, VULKAN_OOM_LOG, False, FailureClass.OUT_OF_MEMORY,
                 "ggml_vulkan: Device memory allocation of size 7680000000 failed.",
                 id="out-of-memory-vulkan-kv"),
    pytest.param(1, UNKNOWN_FLAG_LOG, False, FailureClass.UNKNOWN_FLAG,
                 "error: invalid argument: --bogus-flag", id="unknown-flag"),
    pytest.param(1, "error: unknown argument: --bogus-flag\n", False, FailureClass.UNKNOWN_FLAG,
                 "error: unknown argument: --bogus-flag", id="unknown-flag-older-wording"),
    pytest.param(1, MODEL_LOAD_LOG, False, FailureClass.MODEL_LOAD,
                 "0.00.004.176 E llama_model_load: error loading model: llama_model_loader: "
                 "failed to load model from notgguf.txt", id="model-load-not-a-gguf"),
    pytest.param(-6, CRASH_LOG, False, FailureClass.CRASH, ASSERT_LINE,
                 id="crash-ggml-assert-sigabrt"),
    pytest.param(-11, "0.00.001.000 I srv  llama_server: initializing ...\n", False,
                 FailureClass.CRASH, "killed by SIGSEGV (signal 11)", id="crash-silent-sigsegv"),
    pytest.param(-6, "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:109: CUDA error\n", False,
                 FailureClass.CRASH, "llama.cpp/ggml/src/ggml-cuda/ggml-cuda.cu:109: CUDA error",
                 id="crash-ggml-abort"),
    pytest.param(None, TIMEOUT_LOG, True, FailureClass.READINESS_TIMEOUT, FIFO_LINE,
                 id="readiness-timeout-fifo-model"),
    pytest.param(1, BAD_VALUE_LOG, False, FailureClass.UNKNOWN, BAD_VALUE_LINE,
                 id="unknown-bad-flag-value"),
    pytest.param(1, "", False, FailureClass.UNKNOWN, "the server logged nothing (exit code 1)",
                 id="unknown-silent-exit"),
])
def test_each_class_from_the_servers_lines(exit_code: int | None, log: str, timed_out: bool,
                                           kind: FailureClass, evidence: str) -> None:
    failure = classify_start_failure(exit_code, log, timed_out)
    assert failure == StartFailure(kind, evidence, exit_code)


@pytest.mark.parametrize(("exit_code", "log", "timed_out", "kind"), [
    # A drafter that does not fit the GPU prints both: leaving it out is the cheaper retry.
    pytest.param(1, CUDA_OOM_LOG + DRAFTER_LOAD_LOG, False, FailureClass.DRAFTER_LOAD,
                 id="drafter-load-over-out-of-memory"),
    # The drafter's own load prints the generic "failed to load model" too.
    pytest.param(1, DRAFTER_LOAD_LOG, False, FailureClass.DRAFTER_LOAD,
                 id="drafter-load-over-model-load"),
    # A weights OOM ends in "failed to load model"; the ladder can answer it.
    pytest.param(1, CUDA_OOM_LOG, False, FailureClass.OUT_OF_MEMORY,
                 id="out-of-memory-over-model-load"),
    # A server stopped after the deadline exits by SIGTERM: still a timeout, not a crash.
    pytest.param(-15, TIMEOUT_LOG, True, FailureClass.READINESS_TIMEOUT,
                 id="readiness-timeout-over-crash"),
    # A timeout whose --fit probe logged an error-level load failure before hanging.
    pytest.param(None, MODEL_LOAD_LOG, True, FailureClass.READINESS_TIMEOUT,
                 id="readiness-timeout-over-model-load"),
    # --fit's warning before a signal death: the signal is what ended the start.
    pytest.param(-11, DRAFTER_LOAD_LOG.splitlines()[3], False, FailureClass.CRASH,
                 id="crash-over-fit-warning"),
    # --fit's warning alone is not a model-load failure: the server carried on after it.
    pytest.param(1, DRAFTER_LOAD_LOG.splitlines()[3], False, FailureClass.UNKNOWN,
                 id="fit-warning-is-not-model-load"),
])
def test_precedence(exit_code: int | None, log: str, timed_out: bool,
                    kind: FailureClass) -> None:
    assert classify_start_failure(exit_code, log, timed_out).kind is kind


def test_the_evidence_is_the_first_deciding_line() -> None:
    failure = classify_start_failure(1, MODEL_LOAD_LOG + CUDA_OOM_LOG, False)
    assert failure.kind is FailureClass.OUT_OF_MEMORY
    assert failure.evidence.endswith("cudaMalloc failed: out of memory")
    assert str(failure) == f"out-of-memory: {failure.evidence}"


def test_class_values_are_the_documented_names() -> None:
    assert [c.value for c in FailureClass] == [
        "driver-missing", "drafter-load", "mtp-context", "projector-load", "out-of-memory",
        "unknown-flag", "model-load", "cannot-run-here", "crash", "readiness-timeout",
        "unknown"]


@pytest.mark.parametrize(("exit_code", "log", "words"), [
    (-4, "", "killed by SIGILL"),
    (132, "", "128 + SIGILL"),
    (None, "bash: line 1: 4242 Illegal instruction (core dumped) llama-server", "Illegal"),
    (-4, "0.00.000.100 I build: 1 (abc) with cc for x86_64\n", "killed by SIGILL"),
])
def test_an_illegal_instruction_is_a_build_that_cannot_run_here(
        exit_code: int | None, log: str, words: str) -> None:
    failure = classify_start_failure(exit_code, log, timed_out=False)
    assert failure.kind is FailureClass.CANNOT_RUN_HERE
    assert words in failure.evidence


def test_an_out_of_memory_or_another_signal_is_not_an_illegal_instruction() -> None:
    assert classify_start_failure(-4, CUDA_OOM_LOG, False).kind is FailureClass.OUT_OF_MEMORY
    assert classify_start_failure(-11, "", False).kind is FailureClass.CRASH
    assert classify_start_failure(131, "", False).kind is FailureClass.UNKNOWN


CUDA_NO_DRIVER_LOG = (Path(__file__).parent / "data" / "logs" / "cuda"
                      / "captured-no-driver.log")


def test_a_cuda_build_without_the_driver_is_driver_missing_with_the_fix() -> None:
    # Captured from the CUDA image started without GPU access (tests/data/logs/cuda/).
    log = CUDA_NO_DRIVER_LOG.read_text()
    failure = classify_start_failure(127, log, timed_out=False)
    assert failure.kind is FailureClass.DRIVER_MISSING
    assert "libcuda.so.1" in failure.evidence
    assert "--gpus" in FIXES[FailureClass.DRIVER_MISSING]
    assert "nvidia-container-toolkit" in FIXES[FailureClass.DRIVER_MISSING]


def test_another_missing_library_is_not_a_missing_driver() -> None:
    log = ("/app/llama-server: error while loading shared libraries: libcublas.so.12: "
           "cannot open shared object file: No such file or directory\n")
    assert classify_start_failure(127, log, timed_out=False).kind is FailureClass.UNKNOWN


#: The end of the H200 device check's --no-kv-offload rung (2026-12-04): the KV cache
#: larger than the host's 128 GiB is sized, then the kernel kills the process.
OOM_KILLED_LOG = """\
0.00.174.078 I llama_context:  CUDA_Host  output buffer size =     0.00 MiB
0.10.297.574 I llama_kv_cache:        CPU KV buffer size = 156222.00 MiB
"""


def test_sigkill_right_after_a_host_buffer_is_the_oom_killer() -> None:
    failure = classify_start_failure(-9, OOM_KILLED_LOG, timed_out=False)
    assert failure.kind is FailureClass.OUT_OF_MEMORY
    assert "CPU KV buffer size = 156222.00 MiB" in failure.evidence
    assert "out-of-memory killer" in failure.evidence


@pytest.mark.parametrize(("exit_code", "log"), [
    # Another signal after the same line is a crash, not memory.
    (-11, OOM_KILLED_LOG),
    # SIGKILL after anything but a host buffer's size: killed from outside, a crash.
    (-9, "0.00.1 I llama_context: n_ctx = 512\n"),
    # A GPU buffer's size line is the device's memory, which cudaMalloc reports itself.
    (-9, "0.00.1 I llama_kv_cache:      CUDA0 KV buffer size =   512.00 MiB\n"),
])
def test_other_kills_stay_crashes(exit_code: int, log: str) -> None:
    assert classify_start_failure(exit_code, log, timed_out=False).kind is FailureClass.CRASH
