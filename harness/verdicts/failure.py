"""Why a llama-server start failed, read from its exit status and its own log (pure).

``classify_start_failure`` names one ``FailureClass`` and quotes the log line that decided
it. The lines are llama.cpp's own (pinned source); each pattern below says where it is
printed. The classes are tried in this order, and the first that matches wins:

0. ``driver-missing`` — the dynamic loader could not find the GPU driver's library
   (``libcuda.so.1``), so the server never ran a line of its own: a CUDA build started
   without the driver, e.g. a container on a runner without the NVIDIA container runtime.
   ld.so's words and exit status 127 (captured: tests/data/logs/cuda/captured-*).
1. ``drafter-load`` — ``failed to load draft model``. Loading the drafter goes through the
   same loader as the target, so the same start also prints the generic
   ``llama_model_load_from_file_impl: failed to load model``, and a drafter that does not
   fit the GPU prints the out-of-memory lines too: the drafter is named first because
   leaving it out is the cheapest retry (reference 002, docs/references.md: it is the one
   part of a launch the launch can do without).
2. ``mtp-context`` — ``failed to create MTP context`` (``--spec-type draft-mtp`` on a model
   without an MTP head; docs/design.md, measured). ``projector-load`` — ``failed to load
   multimodal model, '<path>'``: the ``--mmproj`` file did not load (measured on a cut
   projector: ``clip_init: failed to load model '…'``, then that line, exit 1). No retry:
   the vision route is what the launch is for.
3. ``out-of-memory`` — the CUDA/ROCm, ggml-backend, llama-model and Vulkan allocation
   failures. A weights OOM ends in ``failed to load model`` as well, and a CUDA OOM inside
   a kernel aborts the process (``GGML_ABORT``), so this comes before ``model-load`` and
   before ``crash``: the ladder can answer an OOM, not a generic load failure or a signal.
4. ``unknown-flag`` — ``error: invalid argument: --x`` (common/arg.cpp); it is printed
   before anything loads, so nothing else can be in the same log.
5. ``readiness-timeout`` — the process was still alive at the deadline: whatever it had
   logged did not end it. (The caller stops it afterwards, and a stopped server exits by
   SIGTERM, which must not read as a crash; this is why it comes before ``crash``.)
6. ``cannot-run-here`` — the build executed an instruction this CPU does not have: the
   kernel's SIGILL (status -4, or 132 = 128 + 4 where a shell or a container's init
   reports the signal as a status), or a shell's ``Illegal instruction`` line. A build
   made for another CPU (``GGML_NATIVE`` on a newer machine, ``GGML_AVX512`` on a host
   without it) dies so before it prints a line. Not a regression of the code under test
   but of where it runs, so the plugin skips the test (harness/verdicts/instruction_sets.py
   names the instruction sets the build asked for against the host's), and it comes
   before ``crash``, which it would otherwise be.
7. ``crash`` — killed by a signal (a negative exit status from ``subprocess``), e.g. the
   SIGABRT of a failed ``GGML_ASSERT``. It precedes ``model-load`` because ``--fit``'s
   memory probe logs ``failed to load model`` for files it could not measure, and a
   process that then died by a signal did not stop for that reason.
8. ``model-load`` — ``failed to load model`` / ``error loading model`` on an error-level
   line (``--fit``'s *warning* ``… fitting without it: failed to load model`` does not
   count: the server carries on after it).
9. ``unknown`` — none of the above.
"""

from __future__ import annotations

import enum
import re
import signal
from collections.abc import Sequence
from dataclasses import dataclass


class FailureClass(enum.StrEnum):
    """The kinds of failed start the supervisor tells apart (this harness's own names).

    The matching log lines come from llama.cpp; see the module docstring for precedence.
    """

    DRIVER_MISSING = "driver-missing"
    DRAFTER_LOAD = "drafter-load"
    MTP_CONTEXT = "mtp-context"
    PROJECTOR_LOAD = "projector-load"
    OUT_OF_MEMORY = "out-of-memory"
    UNKNOWN_FLAG = "unknown-flag"
    MODEL_LOAD = "model-load"
    CANNOT_RUN_HERE = "cannot-run-here"
    CRASH = "crash"
    READINESS_TIMEOUT = "readiness-timeout"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class StartFailure:
    """A classified failed start: the class and the log line (or status) that decided it."""

    kind: FailureClass
    evidence: str
    #: The process's exit status (negative: the signal that killed it); None if it was
    #: still alive when the start was given up.
    exit_code: int | None = None

    def __str__(self) -> str:
        return f"{self.kind.value}: {self.evidence}"


# How the harness's own error names the class of a launch that never served. The report's
# categories (harness/report/allure_meta.py) find the class by the pattern below, so the
# words and their pattern are kept together here.
_HEADLINE_HEAD = "llama-server did not start after "
_HEADLINE_TAIL = " attempt(s): "


def start_failed_headline(attempts: int, failure: StartFailure) -> str:
    """The first line of the supervisor's error: ``llama-server did not start after 2
    attempt(s): out-of-memory: <evidence>`` (the last start's class and evidence)."""
    return f"{_HEADLINE_HEAD}{attempts}{_HEADLINE_TAIL}{failure}"


def start_failed_pattern(kind: FailureClass) -> str:
    """A regex that finds :func:`start_failed_headline` naming ``kind``, anywhere in a text.

    ``re.escape``'s escapes are ones JavaScript's ``RegExp`` (Allure's, no flags) reads
    alike, so Allure and :func:`harness.report.allure_meta.category_of` agree.
    """
    return (re.escape(_HEADLINE_HEAD) + r"\d+" + re.escape(_HEADLINE_TAIL)
            + re.escape(f"{kind.value}: "))


@dataclass(frozen=True)
class _Rule:
    kind: FailureClass
    patterns: tuple[re.Pattern[str], ...]
    #: Log levels (common/log.cpp's one-letter prefix) whose lines never count.
    ignored_levels: frozenset[str] = frozenset()

    def first_match(self, lines: Sequence[_Line]) -> str | None:
        for line in lines:
            if line.level in self.ignored_levels:
                continue
            if any(p.search(line.text) for p in self.patterns):
                return line.text
        return None


@dataclass(frozen=True)
class _Line:
    text: str
    #: I, W, E or D when common/log.cpp prefixed the line; None for raw stderr output.
    level: str | None


# common/log.cpp prefixes every line it writes with "M.SS.mmm.uuu " (timestamps on) and
# a level letter; ggml's Vulkan backend and the argument parser write to stderr directly.
_PREFIX = re.compile(r"^(?:\d+\.\d{2}\.\d{3}\.\d{3} )?([IWED]) ")

_DRIVER_MISSING = _Rule(FailureClass.DRIVER_MISSING, (
    # glibc's ld.so (dl-load.c): "<program>: error while loading shared libraries: <lib>:
    # cannot open shared object file: No such file or directory". libcuda.so.1 is the
    # NVIDIA driver's user-space half: the toolkit ships only a stub, images never
    # carry it, and the NVIDIA container runtime mounts the host's copy.
    re.compile(r"error while loading shared libraries: libcuda\.so\.1\b"),
))
_DRAFTER_LOAD = _Rule(FailureClass.DRAFTER_LOAD, (
    # common/speculative.cpp (common_speculative_init_result) and
    # tools/server/server-context.cpp (load_model): "failed to load draft model, '<path>'".
    re.compile(r"failed to load draft model"),
))
_MTP_CONTEXT = _Rule(FailureClass.MTP_CONTEXT, (
    # common/speculative.cpp and tools/server/server-context.cpp.
    re.compile(r"failed to create MTP context"),
))
_PROJECTOR_LOAD = _Rule(FailureClass.PROJECTOR_LOAD, (
    # tools/server/server-context.cpp (load_model): "failed to load multimodal model, '%s'".
    re.compile(r"failed to load multimodal model, '[^']*'"),
))
_OUT_OF_MEMORY = _Rule(FailureClass.OUT_OF_MEMORY, (
    # ggml/src/ggml-cuda/ggml-cuda.cu, ggml_backend_cuda_buffer_type_alloc_buffer:
    # "allocating %.2f MiB on device %d: cudaMalloc failed: %s" (HIP builds compile the
    # same code, so ROCm prints the same words).
    re.compile(r"cudaMalloc failed: out of memory"),
    # ggml-cuda.cu, ggml_cuda_error: GGML_CUDA_NAME " error: %s" before GGML_ABORT.
    re.compile(r"\b(?:CUDA|ROCm|MUSA) error: out of memory"),
    # src/llama-model.cpp (load_tensors): "unable to allocate %s buffer".
    re.compile(r"unable to allocate \S+ buffer"),
    # ggml/src/ggml-backend.cpp and ggml-alloc.c: "failed to allocate %s buffer of size %zu".
    re.compile(r"failed to allocate \S+ buffer of size \d+"),
    # ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp: "ggml_vulkan: Device memory allocation
    # of size N failed." then vk::SystemError's text, which names the vk::Result.
    re.compile(r"Device memory allocation of size \d+ failed"),
    re.compile(r"ErrorOutOfDeviceMemory"),
))
_UNKNOWN_FLAG = _Rule(FailureClass.UNKNOWN_FLAG, (
    # common/arg.cpp (common_params_parse_ex): "error: invalid argument: %s"; builds from
    # before the argument parser was rewritten said "error: unknown argument: %s".
    re.compile(r"^error: (?:invalid|unknown) argument: \S+"),
))
_MODEL_LOAD = _Rule(FailureClass.MODEL_LOAD, (
    # src/llama.cpp: "llama_model_load: error loading model: …" and
    # "llama_model_load_from_file_impl: failed to load model"; common/common.cpp and
    # tools/server/server-context.cpp repeat "failed to load model '<path>'".
    re.compile(r"failed to load model"),
    re.compile(r"error loading model"),
), ignored_levels=frozenset({"W", "I", "D"}))

#: The server's own words, tried before the exit status is looked at.
_DECISIVE: tuple[_Rule, ...] = (_DRIVER_MISSING, _DRAFTER_LOAD, _MTP_CONTEXT, _PROJECTOR_LOAD,
                                _OUT_OF_MEMORY, _UNKNOWN_FLAG)

#: What to do about a class no retry can fix, for the error a user reads.
FIXES: dict[FailureClass, str] = {
    FailureClass.DRIVER_MISSING: (
        "the NVIDIA driver's libcuda.so.1 is not there: run where the NVIDIA driver is "
        "installed, or give the container the GPU (`docker run --gpus all`; the engine needs "
        "the NVIDIA container toolkit, nvidia-container-toolkit, registered with "
        "`nvidia-ctk runtime configure --runtime=docker`)"),
    FailureClass.PROJECTOR_LOAD: (
        "the vision projector named in the line above (--mmproj) could not be loaded: check "
        "that the file is whole and is a projector for this model (its projection_dim must "
        "be the model's embedding width), or plan the launch without it"),
}

# The kernel's out-of-memory killer. Linux lends memory it does not have (overcommit), so
# a host buffer larger than RAM allocates, its size line is printed (src/llama-kv-cache.cpp
# "%10s KV buffer size", llama-model.cpp's model and llama-context.cpp's compute buffers),
# and filling it gets the process SIGKILLed, with nothing more in the log. Measured on an
# H200 machine (128 GiB of RAM): "CPU KV buffer size = 156222.00 MiB", then SIGKILL 10 s
# later, where the ladder's --no-kv-offload rung moved a KV cache too big for the GPU.
_HOST_BUFFER_SIZED = re.compile(r"\b(?:CPU\S*|\w+_Host)\s+(?:KV|model|compute|output) buffer "
                                r"size =\s*[\d.]+ MiB\s*$")

# ggml/src/ggml.c (ggml_abort) prints "<file>:<line>: <message>" before abort(): the
# message is "GGML_ASSERT(<cond>) failed" or GGML_ABORT's text; libstdc++ prints
# "terminate called …" before std::abort.
_CRASH_WORDS = re.compile(r"GGML_ASSERT\(.*\) failed|^\S+\.(?:c|cc|cpp|cu|cuh|h|m):\d+: |"
                          r"terminate called|\bSegmentation fault\b")


def classify_start_failure(exit_code: int | None, log: str, timed_out: bool) -> StartFailure:
    """Classify a start that did not become ready.

    ``exit_code``: the process's status (negative: killed by that signal), None while it
    runs; ``log``: its whole log; ``timed_out``: it was alive when readiness gave up.
    """
    lines = _parse(log)
    for rule in _DECISIVE:
        line = rule.first_match(lines)
        if line is not None:
            return StartFailure(rule.kind, line, exit_code)
    if timed_out:
        return StartFailure(FailureClass.READINESS_TIMEOUT,
                            _last_line(lines) or "the server logged nothing", exit_code)
    last = _last_line(lines)
    if exit_code == -signal.SIGKILL and last is not None and _HOST_BUFFER_SIZED.search(last):
        return StartFailure(FailureClass.OUT_OF_MEMORY,
                            f"killed by SIGKILL right after sizing a host buffer: {last} "
                            "(the kernel's out-of-memory killer)", exit_code)
    illegal = _illegal_instruction(lines, exit_code)
    if illegal is not None:
        return StartFailure(FailureClass.CANNOT_RUN_HERE, illegal, exit_code)
    if exit_code is not None and exit_code < 0:
        return StartFailure(FailureClass.CRASH, _crash_evidence(lines, -exit_code), exit_code)
    line = _MODEL_LOAD.first_match(lines)
    if line is not None:
        return StartFailure(FailureClass.MODEL_LOAD, line, exit_code)
    return StartFailure(FailureClass.UNKNOWN, _unknown_evidence(lines, exit_code), exit_code)


#: A shell's (and the kernel's core-dump note's) words for SIGILL.
_ILLEGAL_WORDS = re.compile(r"\bIllegal instruction\b")
#: The status a shell or a container's init gives a child killed by SIGILL.
_SIGILL_STATUS = 128 + signal.SIGILL


def _illegal_instruction(lines: Sequence[_Line], exit_code: int | None) -> str | None:
    """The evidence that the process died of an instruction this CPU lacks, or None."""
    for line in lines:
        if _ILLEGAL_WORDS.search(line.text):
            return line.text
    if exit_code == -signal.SIGILL:
        return f"killed by SIGILL (signal {int(signal.SIGILL)}): an illegal instruction"
    if exit_code == _SIGILL_STATUS:
        return (f"exit status {_SIGILL_STATUS} (128 + SIGILL): an illegal instruction, as a "
                "shell or a container's init reports it")
    return None


def _parse(log: str) -> list[_Line]:
    lines = []
    for raw in log.splitlines():
        text = raw.strip()
        if not text:
            continue
        prefix = _PREFIX.match(text)
        lines.append(_Line(text, prefix.group(1) if prefix else None))
    return lines


def _last_line(lines: Sequence[_Line]) -> str | None:
    return lines[-1].text if lines else None


def _crash_evidence(lines: Sequence[_Line], signum: int) -> str:
    for line in lines:
        if _CRASH_WORDS.search(line.text):
            return line.text
    return f"killed by {_signal_name(signum)} (signal {signum})"


def _unknown_evidence(lines: Sequence[_Line], exit_code: int | None) -> str:
    for line in lines:
        if line.level == "E" or "error" in line.text.lower():
            return line.text
    last = _last_line(lines)
    status = "still running" if exit_code is None else f"exit code {exit_code}"
    return last or f"the server logged nothing ({status})"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"
