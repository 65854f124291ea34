"""Did each model of a launch land on the GPU backend the build was made for? (pure)

A CUDA, ROCm or Vulkan build that cannot use its GPU still starts, serves and answers — on
the CPU, at a fraction of the speed (reference 002, docs/references.md). ``gpu_verdict``
reads the startup log and decides, separately for the target model and for the drafter (a
draft model or an MTP draft context; the blocks are cut by ``log_blocks.split_blocks``),
which of ``GpuState`` holds, and names the log line that decided it.

Evidence, strongest first:

1. GPU buffers: ``<Backend>N model buffer size = X MiB`` with X > 0 (src/llama-model.cpp
   ``load_tensors``) — the weights are on the device (reference 004: what really landed
   on the GPU, not what was asked). An MTP context has no weights of its own, so for it
   the ``KV buffer size`` (src/llama-kv-cache.cpp) and ``compute buffer size``
   (src/llama-context.cpp ``sched_reserve``) lines count. A failed allocation on the
   device (out of memory) also shows the backend was reached. A device whose description
   names a software rasteriser is ``software-device``.
2. Why not, when the buffers are not there: ``ggml_cuda_init: failed to initialize
   CUDA|ROCm: <error>`` (ggml/src/ggml-cuda/ggml-cuda.cu ``ggml_cuda_init``; ROCm is the
   same code under HIP and names itself ``ROCm``) → ``init-failed``; ``ggml_vulkan: No
   devices found.`` (ggml/src/ggml-vulkan/ggml-vulkan.cpp ``ggml_vk_instance_init``; it
   skips CPU-type devices such as llvmpipe) → ``no-devices``; ``warning: no usable GPU
   found, --gpu-layers option will be ignored`` (common/arg.cpp, the ``-ngl`` handler; it is
   all a Vulkan build prints when ``VK_ICD_FILENAMES`` names no driver, docs/design.md) →
   ``no-usable-gpu``.
   A ROCm launch whose environment hid every card on purpose (the build has no code for
   them, ``harness.planning.rocm_env``) is ``hidden-on-purpose`` instead: not the build
   failing its GPU.
3. ``using device <Backend>N (…)`` (src/llama.cpp ``llama_prepare_model_devices``) without
   GPU buffers → ``not-offloaded``: the device was there, the weights stayed on the CPU.
4. Buffer lines, but no sign of the backend at all → ``not-loaded``.
5. No buffer lines for the block and none of the above → ``undecidable`` (the log ends
   before the weights were placed, or was written below ``-lv 4``). Never a pass.

``offloaded N/M layers to GPU`` (``load_tensors``) is cross-checked against the buffers
in every state: N > 0 with no GPU buffer (whether the GPU failed to initialise, was not
found or was not used), or GPU weights with N = 0 and no tensor override to the GPU, is
flagged as ``offload_mismatch``.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from decimal import Decimal

from harness.planning.rocm_env import RocmLaunchEnv
from harness.verdicts.block_report import BlockReport, BufferSize, DeviceUse
from harness.verdicts.gpu_signals import GpuBackend, Signals, read_signals
from harness.verdicts.launch_report import parse_launch_log
from harness.verdicts.log_blocks import BlockKind, BlockRole, message


class GpuState(enum.StrEnum):
    """What one block's log says about its GPU use (this harness's names; see module doc)."""

    USED = "used"
    NO_GPU_EXPECTED = "no-gpu-expected"
    INIT_FAILED = "init-failed"
    NO_DEVICES = "no-devices"
    NOT_LOADED = "not-loaded"
    NOT_OFFLOADED = "not-offloaded"
    SOFTWARE_DEVICE = "software-device"
    NO_USABLE_GPU = "no-usable-gpu"
    #: The launch hid every device of the backend on purpose: a ROCm build with no code
    #: for this host's cards (harness.planning.rocm_env). Not the build failing its GPU.
    HIDDEN = "hidden-on-purpose"
    UNDECIDABLE = "undecidable"


class SoftwareDevice(enum.StrEnum):
    """Device implementations that run on the CPU, matched in a device's description.

    Mesa's llvmpipe (docs/design.md: ``using device Vulkan0 (llvmpipe (LLVM 19.1.7, 256 bits))``)
    and lavapipe, and Google's SwiftShader.
    """

    LLVMPIPE = "llvmpipe"
    LAVAPIPE = "lavapipe"
    SWIFTSHADER = "SwiftShader"


#: ``--backend`` words (harness.facts.build.Backend) and other spellings → GPU backend.
_BACKEND_WORDS: dict[str, GpuBackend | None] = {
    "cpu": None,
    "cuda": GpuBackend.CUDA,
    "rocm": GpuBackend.ROCM,
    "hip": GpuBackend.ROCM,
    "vulkan": GpuBackend.VULKAN,
    "sycl": GpuBackend.SYCL,
    "metal": GpuBackend.METAL,
    "mtl": GpuBackend.METAL,
}


@dataclass(frozen=True)
class BlockGpuUse:
    """The GPU verdict for one block (the target, or the drafter)."""

    role: BlockRole
    state: GpuState
    #: The GPU holding the block's weights (or named by ``using device``), e.g. ``CUDA0``.
    device: str | None
    device_description: str | None
    backend: GpuBackend | None
    #: GPU buffers that decided it: model weights (KV and compute for an MTP context).
    buffers_mib: tuple[BufferSize, ...]
    offloaded_layers: tuple[int, int] | None
    offload_mismatch: bool
    warnings: tuple[str, ...]
    #: Why, in a sentence that quotes the deciding line where there is one.
    explanation: str
    #: The engine's own words for a failure (e.g. CUDA's error string).
    detail: str | None = None

    @property
    def gpu_mib(self) -> dict[str, Decimal]:
        """MiB per GPU buffer name."""
        total: dict[str, Decimal] = {}
        for buf in self.buffers_mib:
            total[buf.buffer] = total.get(buf.buffer, Decimal(0)) + buf.mib
        return total


@dataclass(frozen=True)
class GpuVerdict:
    """Per-block GPU use and the overall answer."""

    expected_backend: GpuBackend | None
    blocks: tuple[BlockGpuUse, ...]
    passed: bool
    reason: str
    warnings: tuple[str, ...]

    def block(self, role: BlockRole) -> BlockGpuUse | None:
        return next((b for b in self.blocks if b.role is role), None)


def parse_expected_backend(value: str | None) -> GpuBackend | None:
    """``cuda``/``rocm``/``vulkan``/… (any case, or a ``GpuBackend``) → backend; None/cpu → None."""
    if value is None:
        return None
    word = str(value).lower()
    if word not in _BACKEND_WORDS:
        raise ValueError(f"unknown backend {value!r}; known: {', '.join(sorted(_BACKEND_WORDS))}")
    return _BACKEND_WORDS[word]


_GPU_NAME = re.compile(r"^(?P<backend>CUDA|ROCm|Vulkan|SYCL|MTL)(?P<index>\d+|_Split)$")


def gpu_backend_of(name: str) -> GpuBackend | None:
    """The GPU backend of a ggml device or buffer name (``CUDA0``, ``ROCm_Split``), else None.

    Host-side buffers (``CUDA_Host``, ``CPU_Mapped``, ``CPU``) are not on the GPU.
    """
    found = _GPU_NAME.match(name)
    return GpuBackend(found["backend"]) if found else None


def software_device(description: str | None) -> SoftwareDevice | None:
    if description is None:
        return None
    lowered = description.lower()
    return next((s for s in SoftwareDevice if s.value.lower() in lowered), None)


# --- one block -----------------------------------------------------------------------------


def _evidence(block: BlockReport) -> tuple[BufferSize, ...]:
    if block.kind is BlockKind.MTP_CONTEXT:
        return block.kv_buffers + block.compute_buffers
    return block.model_buffers


def _reported(block: BlockReport) -> bool:
    """The block got as far as printing where its buffers are (INFO lines present)."""
    return bool(_evidence(block))


def _judge(block: BlockReport, expected: GpuBackend, signals: Signals,
           fallback_devices: tuple[DeviceUse, ...], *,
           launch_env: RocmLaunchEnv | None = None) -> BlockGpuUse:
    role = block.role.value
    on_gpu = tuple(b for b in _evidence(block)
                   if gpu_backend_of(b.buffer) is expected and b.mib > 0)
    devices = tuple(d for d in block.devices or fallback_devices
                    if gpu_backend_of(d.name) is expected)
    failed_allocs = [f.message for f in block.alloc_failures if _on_backend(f.buffer, f.message,
                                                                            expected)]
    holder = next((d for d in devices if any(b.buffer == d.name for b in on_gpu)),
                  devices[0] if devices else None)
    device = holder.name if holder else (on_gpu[0].buffer if on_gpu else None)
    description = holder.description if holder else None
    offloaded = block.offloaded_layers
    warnings: list[str] = []
    mismatch = False

    def verdict(state: GpuState, explanation: str, detail: str | None = None) -> BlockGpuUse:
        return BlockGpuUse(block.role, state, device, description, expected, on_gpu, offloaded,
                           mismatch, tuple(warnings), explanation, detail)

    if on_gpu or failed_allocs:
        if failed_allocs:
            warnings.append(f"{role}: an allocation on the GPU failed: {failed_allocs[0]}")
        gpu_weights = block.kind is BlockKind.MODEL and bool(on_gpu)
        to_gpu = any(gpu_backend_of(o.buffer) is expected for o in block.overrides)
        if offloaded and offloaded[0] == 0 and gpu_weights and not to_gpu:
            mismatch = True
            warnings.append(f"{role}: weights on {device} though the log says "
                            f"'offloaded 0/{offloaded[1]} layers to GPU'")
        elif offloaded and 0 < offloaded[0] < offloaded[1]:
            warnings.append(f"{role}: partial offload, {offloaded[0]}/{offloaded[1]} layers "
                            "on the GPU")
        held = "KV and compute buffers" if block.kind is BlockKind.MTP_CONTEXT else "weights"
        where = (f"{held} " + ", ".join(f"{b.buffer} {b.mib} MiB" for b in on_gpu) if on_gpu
                 else "an allocation was attempted there")
        soft = software_device(description)
        if soft is not None:
            return verdict(GpuState.SOFTWARE_DEVICE,
                           f"{role} on {device} ({description}), a {soft.value} software "
                           f"device that runs on the CPU ({where})")
        named = description or "no 'using device' line"
        kept_out = (f"; {launch_env.describe()}" if launch_env is not None and launch_env.hidden
                    else "")
        return verdict(GpuState.USED, f"{role} on {device} ({named}): {where}{kept_out}")
    # From here on no weights of the block are on the expected GPU. A log that still
    # counts layers offloaded contradicts its own buffers, whatever the reason below
    # (init failed, no devices, not offloaded, …), unless they went to another GPU.
    elsewhere = any(gpu_backend_of(b.buffer) is not None and b.mib > 0
                    for b in _evidence(block))
    if offloaded and offloaded[0] > 0 and not elsewhere:
        mismatch = True
        warnings.append(f"{role}: the log says 'offloaded {offloaded[0]}/{offloaded[1]} "
                        f"layers to GPU' but shows no {expected.value} buffer")
    if signals.lacks(expected):
        return verdict(GpuState.NOT_LOADED,
                       f"the {expected.value} backend is not loaded: the build's system_info "
                       f"lists no {expected.value} features (a build without {expected.value})")
    if launch_env is not None and launch_env.all_hidden:
        return verdict(GpuState.HIDDEN,
                       f"every {expected.value} device was hidden from the launch on purpose, "
                       f"so the {role} ran on the CPU: {launch_env.describe()}")
    if expected in signals.init_failed:
        error = signals.init_failed[expected]
        return verdict(GpuState.INIT_FAILED,
                       f"ggml_cuda_init: failed to initialize {expected.value}: {error}", error)
    if expected is GpuBackend.VULKAN and signals.vulkan_no_devices:
        return verdict(GpuState.NO_DEVICES, "ggml_vulkan: No devices found. (llama.cpp skips "
                       "CPU-type Vulkan devices such as llvmpipe)")
    draft_warning = block.role is BlockRole.DRAFTER and signals.no_usable_gpu_draft
    if signals.no_usable_gpu or draft_warning:
        return verdict(GpuState.NO_USABLE_GPU, "warning: no usable GPU found, the GPU-layers "
                       "option was ignored (no device registered: no driver, or no GPU support)")
    if not _reported(block):
        return verdict(GpuState.UNDECIDABLE,
                       f"no buffer lines for the {role}: the log ends before its weights were "
                       "placed, or was written below -lv 4")
    if devices:
        counted = f" (offloaded {offloaded[0]}/{offloaded[1]})" if offloaded else ""
        return verdict(GpuState.NOT_OFFLOADED,
                       f"{devices[0].name} ({devices[0].description}) was found but holds none "
                       f"of the {role}'s weights{counted}")
    others = sorted({b.buffer for b in _evidence(block) if gpu_backend_of(b.buffer)}
                    | {d.name for d in block.devices})
    if others:
        warnings.append(f"{role}: went to {', '.join(others)}, not {expected.value}")
    return verdict(GpuState.NOT_LOADED,
                   f"no sign of the {expected.value} backend for the {role}: no 'using device "
                   f"{expected.value}<N>' line and no {expected.value} buffer")


def _on_backend(buffer: str | None, text: str, expected: GpuBackend) -> bool:
    if buffer is not None:
        return gpu_backend_of(buffer) is expected
    # The lines without a buffer name say which backend printed them.
    if "cudaMalloc failed" in text:
        return expected in (GpuBackend.CUDA, GpuBackend.ROCM)
    return "ggml_vulkan" in text and expected is GpuBackend.VULKAN


def _cpu_build_block(block: BlockReport) -> BlockGpuUse:
    role = block.role.value
    gpu = tuple(b for b in _evidence(block) if gpu_backend_of(b.buffer) and b.mib > 0)
    warnings = tuple(f"{role}: {b.buffer} holds {b.mib} MiB though no GPU was expected"
                     for b in gpu)
    return BlockGpuUse(block.role, GpuState.NO_GPU_EXPECTED, None, None, None, gpu,
                       block.offloaded_layers, False, warnings,
                       f"{role}: no GPU expected (a CPU build)")


# --- the verdict ---------------------------------------------------------------------------

_PASSING = frozenset({GpuState.USED, GpuState.NO_GPU_EXPECTED})
#: The states a verdict can fail on, in GpuState's order (``software-device`` passes only
#: where it is allowed).
FAILING_STATES: tuple[GpuState, ...] = tuple(s for s in GpuState if s not in _PASSING)
# The verdict's reason for a failed block: "<role>: <state> — <explanation>". The report's
# categories (harness/report/allure_meta.py) find the state by the pattern below.
_REASON_SEPARATOR = " — "


def failed_reason(block: BlockGpuUse) -> str:
    """Why ``block`` fails the verdict, naming its role and state first."""
    return f"{block.role.value}: {block.state.value}{_REASON_SEPARATOR}{block.explanation}"


def failed_reason_pattern(state: GpuState) -> str:
    """A regex that finds :func:`failed_reason` naming ``state`` (for any role), anywhere.

    ``re.escape``'s escapes are ones JavaScript's ``RegExp`` (Allure's, no flags) reads
    alike, so Allure and :func:`harness.report.allure_meta.category_of` agree.
    """
    roles = "|".join(re.escape(role.value) for role in BlockRole)
    return rf"\b(?:{roles}): " + re.escape(state.value + _REASON_SEPARATOR)


def gpu_verdict(log: str, expected_backend: str | None, *,
                allow_software_device: bool = False,
                launch_env: RocmLaunchEnv | None = None) -> GpuVerdict:
    """The GPU use of every block in ``log`` for a build of ``expected_backend``.

    ``expected_backend`` None (or ``cpu``) means no GPU is expected: every block is
    ``no-gpu-expected`` and the verdict passes. ``allow_software_device`` lets a CI run on
    llvmpipe pass (docs/design.md: ``GGML_VK_VISIBLE_DEVICES=0`` selects it on purpose).
    ``launch_env``: a ROCm launch's environment, so that a device it hid on purpose is told
    from one the build failed to use (``hidden-on-purpose``).
    """
    expected = parse_expected_backend(expected_backend)
    report = parse_launch_log(log)
    texts = [message(line) for line in log.splitlines()]
    signals = read_signals(texts)
    target = report.target or BlockReport(BlockRole.TARGET, BlockKind.MODEL, None)
    blocks = [target] + ([report.drafter] if report.drafter else [])
    if expected is None:
        judged = tuple(_cpu_build_block(block) for block in blocks)
    else:
        judged = tuple(_judge(block, expected, signals, target.devices, launch_env=launch_env)
                       for block in blocks)
    warnings = [w for block in judged for w in block.warnings]
    if expected is None and signals.no_usable_gpu:
        warnings.append("-ngl was given to a build with no GPU device ('no usable GPU found')")
    passing = _PASSING | ({GpuState.SOFTWARE_DEVICE} if allow_software_device else set())
    failed = next((block for block in judged if block.state not in passing), None)
    if failed is not None:
        reason = failed_reason(failed)
    else:
        reason = "; ".join(block.explanation for block in judged)
    return GpuVerdict(expected, judged, failed is None, reason, tuple(warnings))
