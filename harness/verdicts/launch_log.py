"""The effective launch, read from a llama-server startup log (pure: text in, frozen data out).

A startup log holds up to two *model blocks*, and this module is where they are told apart
(``gpu_use`` reads the same blocks):

- the **target**: from its first ``using device`` / ``llama_model_loader`` / ``load_tensors``
  / ``llama_context`` / ``llama_kv_cache`` line to the drafter's first line (or the end of
  loading);
- the **drafter**: common/speculative.cpp ``common_speculative_init_result`` announces it
  with ``loading draft model '<path>'`` (a separate GGUF, loaded through the same loader,
  so it has its own ``using device``, ``load_tensors`` and ``llama_context`` lines) or with
  ``creating MTP draft context against the target model '<path>'`` (no model load: a second
  ``llama_context`` on the target's weights).

Both end at the server's ``load_model: initializing, n_slots = …`` line
(tools/server/server-context.cpp). ``--fit`` (on by default) first loads the model with
``no_alloc`` to measure it (common/fit.cpp); at ``-lv 5`` that dry run prints a whole model
block of its own, so everything from ``fitting params to device memory`` to ``fitting
params to free memory took`` is left out of the blocks.

Lines read, with the function that prints them (pinned source):

- ``llama_model_load_from_file_impl`` → src/llama.cpp ``llama_prepare_model_devices``:
  ``using device CUDA0 (NVIDIA …) (0000:01:00.0) - 23592 MiB free``
- src/llama-model.cpp ``load_tensors``: ``offloaded %d/%d layers to GPU`` (only when a GPU
  device is registered) and ``%12s model buffer size = %8.2f MiB`` per buffer
- src/llama-model-loader.cpp (``-lv 5``, DEBUG): ``tensor %s (%zu MiB %s) buffer type
  overridden to %s``; and once per process the WARN ``tensor overrides to CPU are used
  with mmap enabled``
- src/llama-context.cpp ``llama_context``: ``n_seq_max``, ``n_ctx``, ``n_ctx_seq``,
  ``n_batch``, ``n_ubatch``, ``flash_attn`` (auto/enabled/disabled), ``kv_unified``;
  ``resolve_fused_ops``: ``Flash Attention enabled`` / ``… not supported, set to
  disabled`` (how ``auto`` resolved); ``llama_init_from_model``: ``enabling flash_attn
  since it is required for …``; ``%10s  output buffer size``, ``%10s compute buffer size``
- src/llama-kv-cache.cpp: ``%10s KV buffer size = %8.2f MiB`` and the size line
  (``harness.verdicts.kv_log``)
- src/llama-model.cpp ``print_info``: ``n_ctx_train = %u``
- src/llama-model.cpp ``load_tensors``: ``loading model tensors, this can take a while...
  (load_mode = %s)`` (the requested mode; ``auto`` is printed as what it resolved to,
  ``llama_load_mode_name``), and whether the host weights sit in a ``*_Mapped`` buffer (a
  buffer made from the mmap, ``ggml_backend_dev_buffer_from_host_ptr``) or a plain one
- src/llama.cpp ``llama_prepare_model_devices``: ``creating a Meta device for tensor
  parallelism from %zu devices`` / ``creating a Meta device with %zu devices``
  (``--split-mode tensor``); with ``--split-mode none`` it keeps only the ``--main-gpu``-th
  device, so exactly one ``using device`` line remains
- src/llama-mmap.cpp ``llama_mlock::raw_lock``: ``warning: failed to mlock %zu-byte buffer
  (after previously locking %zu bytes): %s`` and ``warning: mlock not supported on this
  system`` (WARN; a successful lock prints nothing)
- common/speculative.cpp, each draft implementation's constructor (``draft-simple``,
  ``draft-eagle3``, ``draft-mtp`` at TRACE, ``draft-dflash``/``draft-dspark`` at INFO — both
  shown at ``-lv 4``): ``- n_max=%d, n_min=%d, p_min=%f`` (``%.2f`` for draft-mtp and the
  block drafters); printed before draft-mtp clamps ``n_max`` to its chained heads, so it is
  the value the server was given
- tools/server/server-context.cpp ``load_model`` (TRACE): ``context checkpoints enabled,
  max = %d, min spacing = %d`` or ``context checkpoints disabled``
- tools/server/server-context.cpp ``load_model``: ``loading model '%s'``, ``initializing,
  n_slots = %d, n_ctx_slot = %d, kv_unified = '%s'``, ``speculative decoding context
  initialized``, ``failed to initialize speculative decoding context: %s``,
  ``failed to load draft model``, ``failed to create MTP context``
- common/speculative.cpp: ``adding speculative implementation '%s'``
- allocation failures: ggml/src/ggml-backend.cpp ``ggml_backend_buft_alloc_buffer_n_default``
  (``failed to allocate %s buffer of size %zu``), ggml/src/ggml-cuda/ggml-cuda.cu
  ``ggml_backend_cuda_buffer_type_alloc_buffer`` (``allocating %.2f MiB on device %d:
  cudaMalloc failed: %s``), ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp
  ``ggml_vk_create_buffer_device`` (``ggml_vulkan: Device memory allocation of size … failed.``),
  src/llama-model.cpp ``load_tensors`` (``unable to allocate %s buffer``)

``compare_launch`` checks a planned launch against the report, applying the request the
way llama_context does (``n_ctx`` padded to 256, ``n_batch`` capped by ``n_ctx``…), and
returns every field that differs. ``unverifiable`` names the planned fields a build cannot
show at all (a CPU build has no GPU device to split over, select or put the KV cache on),
each with the reason, so a caller leaves them out loudly instead of passing them silently.
"""

from __future__ import annotations

import enum
import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath
from types import MappingProxyType

from harness.facts.build import Backend
from harness.facts.gpu import LoadMode, SplitMode
from harness.verdicts.kv_log import KvLogLine, parse_kv_cache_lines


class BlockRole(enum.StrEnum):
    """Whose block a part of the log is: the served model, or its speculative drafter."""

    TARGET = "target"
    DRAFTER = "drafter"


class BlockKind(enum.StrEnum):
    """What a block loads: a model (GGUF + context) or only an MTP context on the target.

    The two ways common/speculative.cpp ``common_speculative_init_result`` makes a draft
    context: a draft model file, or ``LLAMA_CONTEXT_TYPE_MTP`` on the target model.
    """

    MODEL = "model"
    MTP_CONTEXT = "mtp-context"


class FlashAttnMode(enum.StrEnum):
    """``llama_context: flash_attn = …`` words (src/llama.cpp ``llama_flash_attn_type_name``)."""

    AUTO = "auto"
    ENABLED = "enabled"
    DISABLED = "disabled"


@dataclass(frozen=True)
class BufferSize:
    """One ``<buffer> … buffer size = X MiB`` line: ggml's buffer name and MiB as printed."""

    buffer: str
    mib: Decimal


@dataclass(frozen=True)
class DeviceUse:
    """One ``using device`` line: a device the model was given (not yet that it holds weights)."""

    name: str
    description: str
    device_id: str | None
    free_mib: int | None


@dataclass(frozen=True)
class TensorOverride:
    """One ``-lv 5`` ``buffer type overridden`` line (``--n-cpu-moe``, ``-ot`` and friends)."""

    tensor: str
    #: The ``blk.N.`` index, None for tensors outside the repeating blocks.
    block: int | None
    #: Whole MiB, as the loader prints it (``%zu`` of bytes / 1024 / 1024).
    mib: int
    type: str
    buffer: str


@dataclass(frozen=True)
class AllocFailure:
    """A failed buffer allocation; ``buffer`` is ggml's name for it when the line gives one."""

    buffer: str | None
    message: str


@dataclass(frozen=True)
class DraftParams:
    """One draft implementation's ``- n_max=%d, n_min=%d, p_min=…`` line (speculative.cpp)."""

    n_max: int
    n_min: int
    #: As printed: six decimals (``%f``) or two (``%.2f``), depending on the implementation.
    p_min: Decimal


@dataclass(frozen=True)
class LogBlock:
    """The raw lines of one model block, as ``split_blocks`` cut them."""

    role: BlockRole
    kind: BlockKind
    model_path: str | None
    lines: tuple[str, ...]


@dataclass(frozen=True)
class BlockReport:
    """What one model block says about its model and its context."""

    role: BlockRole
    kind: BlockKind
    model_path: str | None
    devices: tuple[DeviceUse, ...] = ()
    #: ``offloaded N/M layers to GPU`` as (N, M); absent on a build with no GPU device.
    offloaded_layers: tuple[int, int] | None = None
    model_buffers: tuple[BufferSize, ...] = ()
    overrides: tuple[TensorOverride, ...] = ()
    n_ctx_train: int | None = None
    n_seq_max: int | None = None
    n_ctx: int | None = None
    n_ctx_seq: int | None = None
    n_batch: int | None = None
    n_ubatch: int | None = None
    kv_unified: bool | None = None
    #: The mode the context was created with (after llama_init_from_model's adjustments).
    flash_attn_mode: FlashAttnMode | None = None
    #: Whether flash attention runs: the mode, or for ``auto`` how resolve_fused_ops settled it.
    flash_attn: bool | None = None
    #: Why llama_init_from_model turned ``auto`` into ``enabled`` (e.g. "quantized V cache").
    flash_attn_forced: str | None = None
    kv_caches: tuple[KvLogLine, ...] = ()
    kv_buffers: tuple[BufferSize, ...] = ()
    compute_buffers: tuple[BufferSize, ...] = ()
    alloc_failures: tuple[AllocFailure, ...] = ()
    #: ``load_tensors: … (load_mode = X)``: the mode the loader was asked for (auto resolved).
    load_mode: LoadMode | None = None
    #: ``creating a Meta device … N devices``: the model is split by tensor over N devices.
    tensor_split_devices: int | None = None

    @property
    def model_buffers_mib(self) -> dict[str, Decimal]:
        """Model weights per buffer (``CPU_Mapped``, ``CUDA0``, …), summed over repeats."""
        return _sum_by_buffer(self.model_buffers)

    @property
    def weights_mapped(self) -> bool | None:
        """Whether weights sit in a buffer made from the mmap (``CPU_Mapped``); None when no
        model buffer line was printed. Without mmap the host weights are in ``CPU`` (or a GPU
        backend's pinned ``CUDA_Host``-style buffer)."""
        if not self.model_buffers:
            return None
        return any(buf.buffer.endswith(_MAPPED_SUFFIX) for buf in self.model_buffers)

    @property
    def gpu_devices(self) -> tuple[str, ...]:
        """The GPU devices of the ``using device`` lines (``CUDA0``, …), in order."""
        return tuple(d.name for d in self.devices if _GPU_DEVICE.match(d.name))

    @property
    def kv_on_gpu(self) -> bool | None:
        """Whether any ``KV buffer size`` line names a GPU buffer; None without KV lines."""
        if not self.kv_buffers:
            return None
        return any(_GPU_DEVICE.match(buf.buffer) for buf in self.kv_buffers)

    @property
    def has_context(self) -> bool:
        return self.n_ctx is not None


@dataclass(frozen=True)
class LaunchReport:
    """The launch as the server itself reported it while starting."""

    target: BlockReport | None
    drafter: BlockReport | None
    n_slots: int | None
    n_ctx_slot: int | None
    #: The ``kv_unified`` the server settled on for its slots.
    slots_kv_unified: bool | None
    #: ``loading draft model '<path>'``: a drafter file was asked for.
    drafter_path: str | None
    #: ``adding speculative implementation '<type>'`` in order.
    speculative_types: tuple[str, ...]
    #: ``speculative decoding context initialized``: speculation is live in the slots.
    speculative_ready: bool
    #: The server's own words when the drafter or MTP context could not be set up.
    speculative_error: str | None
    #: ``tensor overrides to CPU are used with mmap enabled`` (visible at ``-lv 4``).
    cpu_override_warning: bool
    #: Each draft implementation's ``- n_max=…, n_min=…, p_min=…`` line, in order.
    draft_params: tuple[DraftParams, ...] = ()
    #: ``context checkpoints enabled, max = N, …``; 0 for ``context checkpoints disabled``.
    ctx_checkpoints: int | None = None
    #: ``… min spacing = M``; None when checkpoints are disabled (the line has no spacing).
    checkpoint_min_step: int | None = None
    #: ``warning: failed to mlock …`` / ``mlock not supported …``, as printed.
    mlock_failures: tuple[str, ...] = ()

    # The target's context, under the names a plan uses for them.
    @property
    def n_ctx(self) -> int | None:
        return self.target.n_ctx if self.target else None

    @property
    def n_ctx_seq(self) -> int | None:
        return self.target.n_ctx_seq if self.target else None

    @property
    def n_batch(self) -> int | None:
        return self.target.n_batch if self.target else None

    @property
    def n_ubatch(self) -> int | None:
        return self.target.n_ubatch if self.target else None

    @property
    def flash_attn_mode(self) -> FlashAttnMode | None:
        return self.target.flash_attn_mode if self.target else None

    @property
    def flash_attn(self) -> bool | None:
        return self.target.flash_attn if self.target else None

    @property
    def kv_caches(self) -> tuple[KvLogLine, ...]:
        return self.target.kv_caches if self.target else ()

    @property
    def type_k(self) -> str | None:
        """The target's K cache type; None when absent or when its caches disagree."""
        return _single({line.type_k for line in self.kv_caches})

    @property
    def type_v(self) -> str | None:
        return _single({line.type_v for line in self.kv_caches})

    @property
    def model_buffers_mib(self) -> dict[str, Decimal]:
        return self.target.model_buffers_mib if self.target else {}

    @property
    def overrides(self) -> tuple[TensorOverride, ...]:
        return self.target.overrides if self.target else ()

    @property
    def load_mode(self) -> LoadMode | None:
        return self.target.load_mode if self.target else None

    @property
    def weights_mapped(self) -> bool | None:
        return self.target.weights_mapped if self.target else None

    @property
    def gpu_devices(self) -> tuple[str, ...]:
        return self.target.gpu_devices if self.target else ()

    @property
    def kv_on_gpu(self) -> bool | None:
        return self.target.kv_on_gpu if self.target else None

    @property
    def drafter_loaded(self) -> bool:
        """A draft model file loaded: its weights were placed in buffers, no load error."""
        return (self.drafter is not None and self.drafter.kind is BlockKind.MODEL
                and bool(self.drafter.model_buffers) and not self._drafter_load_failed)

    @property
    def mtp_context_created(self) -> bool:
        return (self.drafter is not None and self.drafter.kind is BlockKind.MTP_CONTEXT
                and self.drafter.has_context and not self._mtp_failed)

    @property
    def _drafter_load_failed(self) -> bool:
        error = self.speculative_error
        return error is not None and error.startswith("failed to load draft model")

    @property
    def _mtp_failed(self) -> bool:
        error = self.speculative_error
        return error is not None and error.startswith("failed to create MTP context")


# --- the log's structure -------------------------------------------------------------------

#: ``0.00.011.270 I `` / ``D `` …: common/log.cpp's timestamp and level letter.
_PREFIX = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ")
_FIT_START = re.compile(r"fitting params to device memory|getting device memory data")
_FIT_END = re.compile(r"fitting params to free memory took")
_TARGET_PATH = re.compile(r"load_model: loading model '(?P<path>[^']*)'")
_TARGET_START = re.compile(
    r"using device |llama_model_loader: |load_tensors: |llama_context: |llama_kv_cache")
_DRAFT_MODEL = re.compile(r"loading draft model '(?P<path>[^']*)'")
_MTP_CONTEXT = re.compile(r"creating MTP draft context against the target model '(?P<path>[^']*)'")
_SLOTS = re.compile(
    r"initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+), "
    r"kv_unified = '(?P<unified>true|false)'")


def _drafter_start(line: str) -> tuple[BlockKind, str] | None:
    if found := _DRAFT_MODEL.search(line):
        return BlockKind.MODEL, found["path"]
    if found := _MTP_CONTEXT.search(line):
        return BlockKind.MTP_CONTEXT, found["path"]
    return None


def message(line: str) -> str:
    """A log line without common/log.cpp's timestamp and level letter."""
    return _PREFIX.sub("", line, count=1)


def split_blocks(log: str) -> tuple[LogBlock, ...]:
    """The target and drafter blocks of ``log``, in order (see the module docstring)."""
    blocks: list[LogBlock] = []
    current: tuple[BlockRole, BlockKind, str | None] | None = None
    lines: list[str] = []
    target_path: str | None = None
    in_fit = done = False

    def close() -> None:
        if current is not None:
            blocks.append(LogBlock(current[0], current[1], current[2], tuple(lines)))
        lines.clear()

    for line in log.splitlines():
        if done:
            break
        if in_fit:
            in_fit = _FIT_END.search(line) is None
            continue
        if _FIT_START.search(line):
            in_fit = True
            continue
        if (found := _TARGET_PATH.search(line)) and current is None:
            target_path = found["path"]
            continue
        if starts := _drafter_start(line):
            close()
            current = (BlockRole.DRAFTER, *starts)
            continue
        if _SLOTS.search(line):
            done = True
            continue
        if current is None:
            if not _TARGET_START.search(line):
                continue
            current = (BlockRole.TARGET, BlockKind.MODEL, target_path)
        lines.append(line)
    close()
    return tuple(blocks)


# --- one block -----------------------------------------------------------------------------

_USING_DEVICE = re.compile(
    r"using device (?P<name>\S+) \((?P<desc>.*?)\)"
    r"(?: \((?P<id>[^()]*)\) - (?P<free>\d+) MiB free)?\s*$")
_OFFLOADED = re.compile(r"offloaded (?P<n>\d+)/(?P<m>\d+) layers to GPU")
_MODEL_BUFFER = re.compile(r"(?P<buf>\S+) model buffer size =\s*(?P<mib>\d+\.\d+) MiB")
_KV_BUFFER = re.compile(r"(?P<buf>\S+) KV buffer size =\s*(?P<mib>\d+\.\d+) MiB")
_COMPUTE_BUFFER = re.compile(r"(?P<buf>\S+) compute buffer size =\s*(?P<mib>\d+\.\d+) MiB")
_OVERRIDE = re.compile(
    r"tensor (?P<tensor>\S+) \((?P<mib>\d+) MiB (?P<type>\S+)\) buffer type overridden to "
    r"(?P<buf>\S+)")
_BLK = re.compile(r"^blk\.(\d+)\.")
_CONTEXT_INT = re.compile(
    r"llama_context: (?P<key>n_seq_max|n_ctx|n_ctx_seq|n_batch|n_ubatch)\s+= (?P<value>\d+)\s*$")
_FLASH_MODE = re.compile(r"llama_context: flash_attn\s+= (?P<mode>auto|enabled|disabled)")
_KV_UNIFIED = re.compile(r"llama_context: kv_unified\s+= (?P<value>true|false)")
_FA_RESOLVED = re.compile(r"Flash Attention (?P<how>enabled|not supported, set to disabled)")
_FA_FORCED = re.compile(r"enabling flash_attn since it is required for (?P<why>.+?)\s*$")
_N_CTX_TRAIN = re.compile(r"print_info: n_ctx_train\s+= (?P<value>\d+)")
_LOAD_MODE = re.compile(
    r"loading model tensors, this can take a while\.\.\. \(load_mode = "
    r"(?P<mode>" + "|".join(re.escape(m.value) for m in LoadMode) + r")\)")
_TENSOR_SPLIT = re.compile(
    r"creating a Meta device (?:for tensor parallelism from|with) (?P<n>\d+) devices")
#: A buffer made from a host pointer is named ``*_Mapped`` (ggml/src/ggml-backend.cpp
#: ``ggml_backend_cpu_buffer_from_ptr_type_get_name``: ``CPU_Mapped``; Metal's
#: ``MTL0_Mapped``); load_tensors makes one only on the mmap path.
_MAPPED_SUFFIX = "_Mapped"
#: A device of a GPU backend, or a buffer on one: the backend's name and an index (the names
#: ``harness.verdicts.gpu_use.GpuBackend`` lists; host buffers such as ``CUDA_Host`` and
#: ``CPU`` do not match). Kept here because gpu_use imports this module.
_GPU_DEVICE = re.compile(r"^(?:CUDA|ROCm|Vulkan|SYCL|MTL)(?P<index>\d+)$")
_ALLOC_FAILED = (
    re.compile(r"failed to allocate (?P<buf>\S+) buffer of size \d+"),
    re.compile(r"unable to allocate (?P<buf>\S+) buffer"),
    re.compile(r"allocating [\d.]+ MiB on device \d+: cudaMalloc failed"),
    re.compile(r"ggml_vulkan: Device memory allocation of size \d+ failed"),
)


def parse_block(block: LogBlock) -> BlockReport:
    """The report of one block's lines."""
    messages = [message(line) for line in block.lines]
    ints: dict[str, int] = {}
    for text in messages:
        if (found := _CONTEXT_INT.search(text)) and found["key"] not in ints:
            ints[found["key"]] = int(found["value"])
    mode = _first(_FLASH_MODE, messages, "mode")
    flash_mode = FlashAttnMode(mode) if mode else None
    resolved = _first(_FA_RESOLVED, messages, "how")
    unified = _first(_KV_UNIFIED, messages, "value")
    offloaded = next((found for text in messages if (found := _OFFLOADED.search(text))), None)
    n_ctx_train = _first(_N_CTX_TRAIN, messages, "value")
    load_mode = _first(_LOAD_MODE, messages, "mode")
    tensor_split = _first(_TENSOR_SPLIT, messages, "n")
    return BlockReport(
        role=block.role,
        kind=block.kind,
        model_path=block.model_path,
        devices=tuple(_devices(messages)),
        offloaded_layers=(int(offloaded["n"]), int(offloaded["m"])) if offloaded else None,
        model_buffers=tuple(_buffers(_MODEL_BUFFER, messages)),
        overrides=tuple(_overrides(messages)),
        n_ctx_train=int(n_ctx_train) if n_ctx_train else None,
        n_seq_max=ints.get("n_seq_max"),
        n_ctx=ints.get("n_ctx"),
        n_ctx_seq=ints.get("n_ctx_seq"),
        n_batch=ints.get("n_batch"),
        n_ubatch=ints.get("n_ubatch"),
        kv_unified=None if unified is None else unified == "true",
        flash_attn_mode=flash_mode,
        flash_attn=_effective_flash_attn(flash_mode, resolved),
        flash_attn_forced=_first(_FA_FORCED, messages, "why"),
        kv_caches=parse_kv_cache_lines("\n".join(messages)),
        kv_buffers=tuple(_buffers(_KV_BUFFER, messages)),
        compute_buffers=tuple(_buffers(_COMPUTE_BUFFER, messages)),
        alloc_failures=tuple(_alloc_failures(messages)),
        load_mode=LoadMode(load_mode) if load_mode else None,
        tensor_split_devices=int(tensor_split) if tensor_split else None,
    )


def _effective_flash_attn(mode: FlashAttnMode | None, resolved: str | None) -> bool | None:
    if mode is FlashAttnMode.ENABLED:
        return True
    if mode is FlashAttnMode.DISABLED:
        return False
    # auto: resolve_fused_ops decides while reserving the graph; no line, no decision.
    return None if resolved is None else resolved == "enabled"


def _first(pattern: re.Pattern[str], texts: Iterable[str], group: str) -> str | None:
    return next((found[group] for text in texts if (found := pattern.search(text))), None)


def _devices(texts: Iterable[str]) -> Iterator[DeviceUse]:
    for text in texts:
        if found := _USING_DEVICE.search(text):
            yield DeviceUse(found["name"], found["desc"], found["id"],
                            int(found["free"]) if found["free"] else None)


def _buffers(pattern: re.Pattern[str], texts: Iterable[str]) -> Iterator[BufferSize]:
    for text in texts:
        if found := pattern.search(text):
            yield BufferSize(found["buf"], Decimal(found["mib"]))


def _overrides(texts: Iterable[str]) -> Iterator[TensorOverride]:
    for text in texts:
        if found := _OVERRIDE.search(text):
            blk = _BLK.match(found["tensor"])
            yield TensorOverride(found["tensor"], int(blk[1]) if blk else None,
                                 int(found["mib"]), found["type"], found["buf"])


def _alloc_failures(texts: Iterable[str]) -> Iterator[AllocFailure]:
    for text in texts:
        for pattern in _ALLOC_FAILED:
            if found := pattern.search(text):
                buffer = found.groupdict().get("buf")
                yield AllocFailure(buffer, text.strip())
                break


def _sum_by_buffer(buffers: Iterable[BufferSize]) -> dict[str, Decimal]:
    total: dict[str, Decimal] = {}
    for buf in buffers:
        total[buf.buffer] = total.get(buf.buffer, Decimal(0)) + buf.mib
    return total


def _single(values: set[str]) -> str | None:
    return next(iter(values)) if len(values) == 1 else None


# --- the whole launch ----------------------------------------------------------------------

_SPEC_TYPE = re.compile(r"adding speculative implementation '(?P<type>[^']+)'")
_SPEC_READY = re.compile(r"speculative decoding context initialized")
_SPEC_ERROR = re.compile(
    r"(?P<error>(?:failed to load draft model|failed to create MTP context|"
    r"failed to initialize speculative decoding context).*?)\s*$")
_CPU_OVERRIDE_WARNING = re.compile(r"tensor overrides to CPU are used with mmap enabled")
_DRAFT_PARAMS = re.compile(
    r"- n_max=(?P<n_max>-?\d+), n_min=(?P<n_min>-?\d+), p_min=(?P<p_min>-?\d+\.\d+)")
_CHECKPOINTS_ON = re.compile(
    r"context checkpoints enabled, max = (?P<max>-?\d+), min spacing = (?P<step>-?\d+)")
_CHECKPOINTS_OFF = re.compile(r"context checkpoints disabled")
_MLOCK_FAILED = re.compile(
    r"(?P<error>warning: (?:failed to (?:mlock|VirtualLock) \d+-byte buffer|"
    r"mlock not supported on this system).*?)\s*$")


def parse_launch_log(log: str) -> LaunchReport:
    """Everything the startup log says about the launch; absent lines leave fields None."""
    blocks = [parse_block(block) for block in split_blocks(log)]
    target = next((b for b in blocks if b.role is BlockRole.TARGET), None)
    drafter = next((b for b in blocks if b.role is BlockRole.DRAFTER), None)
    slots = next((found for line in log.splitlines() if (found := _SLOTS.search(line))), None)
    texts = [message(line) for line in log.splitlines()]
    draft_path = _first(_DRAFT_MODEL, texts, "path")
    checkpoints = next((found for text in texts if (found := _CHECKPOINTS_ON.search(text))),
                       None)
    disabled = any(_CHECKPOINTS_OFF.search(text) for text in texts)
    return LaunchReport(
        target=target,
        drafter=drafter,
        n_slots=int(slots["slots"]) if slots else None,
        n_ctx_slot=int(slots["ctx"]) if slots else None,
        slots_kv_unified=slots["unified"] == "true" if slots else None,
        drafter_path=draft_path,
        speculative_types=tuple(found["type"] for text in texts
                                if (found := _SPEC_TYPE.search(text))),
        speculative_ready=any(_SPEC_READY.search(text) for text in texts),
        speculative_error=_first(_SPEC_ERROR, texts, "error"),
        cpu_override_warning=any(_CPU_OVERRIDE_WARNING.search(text) for text in texts),
        draft_params=tuple(DraftParams(int(found["n_max"]), int(found["n_min"]),
                                       Decimal(found["p_min"]))
                           for text in texts if (found := _DRAFT_PARAMS.search(text))),
        ctx_checkpoints=int(checkpoints["max"]) if checkpoints else (0 if disabled else None),
        checkpoint_min_step=int(checkpoints["step"]) if checkpoints else None,
        mlock_failures=tuple(found["error"] for text in texts
                             if (found := _MLOCK_FAILED.search(text))),
    )


# --- planned against observed --------------------------------------------------------------

#: llama_context pads the context to this many cells (src/llama-context.cpp, GGML_PAD).
CTX_PAD = 256
#: LLM_FFN_EXPS_REGEX / LLM_FFN_DENSE_REGEX of common/common.h: what --n-cpu-moe and
#: --n-cpu-ffn move to the CPU, block by block.
_EXPERT_TENSOR = re.compile(r"\.ffn_(up|down|gate|gate_up)_(ch|)exps")
_DENSE_FFN_TENSOR = re.compile(r"\.ffn_(up|down|gate)\.")


@dataclass(frozen=True)
class Mismatch:
    """A planned field the server did not end up with."""

    field: str
    planned: object
    observed: object
    #: What the server makes of the planned value, when that is not the value itself.
    detail: str = ""

    def __str__(self) -> str:
        note = f" ({self.detail})" if self.detail else ""
        return f"{self.field}: planned {self.planned!r}, observed {self.observed!r}{note}"


@dataclass(frozen=True)
class _Check:
    expected: object
    observed: object
    detail: str = ""
    #: Set when the check is not plain equality of ``expected`` and ``observed``.
    ok: bool | None = None

    @property
    def matches(self) -> bool:
        return self.expected == self.observed if self.ok is None else self.ok


_Comparer = Callable[[object, LaunchReport], _Check]


def compare_launch(expected: Mapping[str, object], report: LaunchReport) -> tuple[Mismatch, ...]:
    """Every planned field the log contradicts; ``()`` when the plan reached the server intact.

    Keys are ``LaunchSpec`` names (``ctx_size``, ``parallel``, ``batch_size``,
    ``ubatch_size``, ``cache_type_k``, ``cache_type_v``, ``flash_attn``, ``n_gpu_layers``,
    ``split_mode``, ``main_gpu``, ``kv_offload``, ``load_mode``, ``ctx_checkpoints``,
    ``checkpoint_min_step``, ``spec_draft_n_min``, ``spec_draft_n_max``,
    ``spec_draft_p_min``, ``drafter``, ``spec_type``, ``n_cpu_moe``, ``cpu_moe``,
    ``n_cpu_ffn``) or report names
    (``n_ctx``, ``n_ctx_seq``, ``n_batch``, ``n_ubatch``, ``n_slots``, ``type_k``,
    ``type_v``, ``flash_attn_effective``, ``drafter_loaded``, ``mtp_context``,
    ``speculative_ready``, ``overrides``). A None value (and ``cpu_moe`` False, LaunchSpec's
    default) is not planned and is skipped. A field the log cannot show counts as a
    mismatch (observed None, with why); leave such fields out with ``unverifiable`` first.
    Raises ValueError for an unknown key.
    """
    unknown = sorted(set(expected) - set(_COMPARERS))
    if unknown:
        raise ValueError(f"compare_launch: unknown field(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(_COMPARERS))}")
    found: list[Mismatch] = []
    for key, planned in expected.items():
        if planned is None:
            continue
        check = _COMPARERS[key](planned, report)
        if not check.matches:
            found.append(Mismatch(key, planned, check.observed, check.detail))
    return tuple(found)


def _int(value: object, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"compare_launch: {key} must be an int, got {value!r}")
    return value


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def applied_n_ctx(ctx_size: int, n_seq_max: int, kv_unified: bool) -> int:
    """``n_ctx`` as llama_context makes it from ``-c``: padded to 256, and with one stream per
    sequence, split into padded per-sequence windows and multiplied back."""
    n_ctx = _pad(ctx_size)
    if kv_unified:
        return n_ctx
    return _pad(n_ctx // n_seq_max) * n_seq_max


def _ctx_size(value: object, report: LaunchReport) -> _Check:
    ctx = _int(value, "ctx_size")
    target = report.target
    if ctx == 0 or target is None or target.n_seq_max is None or target.kv_unified is None:
        # 0 asks the server for the model's own length: nothing planned to compare.
        return _Check(ctx if ctx else None, report.n_ctx if ctx else None)
    want = applied_n_ctx(ctx, target.n_seq_max, target.kv_unified)
    detail = "" if want == ctx else f"the server makes it n_ctx {want}"
    return _Check(want, report.n_ctx, detail)


def _batch_size(value: object, report: LaunchReport) -> _Check:
    batch = _int(value, "batch_size")
    if report.n_ctx is None:
        return _Check(batch, None)
    # Causal attention caps the logical batch at the context (llama_context).
    want = min(batch, report.n_ctx)
    return _Check(want, report.n_batch, "" if want == batch else f"capped to n_ctx {want}")


def _ubatch_size(value: object, report: LaunchReport) -> _Check:
    ubatch = _int(value, "ubatch_size")
    if report.n_batch is None:
        return _Check(ubatch, None)
    want = min(ubatch, report.n_batch)
    return _Check(want, report.n_ubatch, "" if want == ubatch else f"capped to n_batch {want}")


def _flash_attn(value: object, report: LaunchReport) -> _Check:
    words = {FlashAttnMode.ENABLED: "on", FlashAttnMode.DISABLED: "off", FlashAttnMode.AUTO: "auto"}
    mode = report.flash_attn_mode
    observed = words[mode] if mode else None
    forced = report.target is not None and report.target.flash_attn_forced is not None
    if forced and mode is FlashAttnMode.ENABLED:
        # llama_init_from_model turned the requested auto into enabled and said why.
        observed = "auto"
    return _Check(str(getattr(value, "value", value)), observed)


def _n_gpu_layers(value: object, report: LaunchReport) -> _Check:
    ngl = _int(value, "n_gpu_layers")
    offloaded = report.target.offloaded_layers if report.target else None
    if offloaded is None:
        return _Check(ngl, None, "no 'offloaded N/M layers to GPU' line (a build without GPU)")
    want = min(ngl, offloaded[1]) if ngl >= 0 else offloaded[1]
    return _Check(want, offloaded[0], f"of {offloaded[1]} offloadable")


def _drafter(value: object, report: LaunchReport) -> _Check:
    path = str(value)
    observed = report.drafter_path if report.drafter_loaded else None
    return _Check(_norm_path(path), _norm_path(observed) if observed else None)


def _norm_path(path: str) -> str:
    return str(PurePath(path))


def _spec_type(value: object, report: LaunchReport) -> _Check:
    return _Check(str(value), ",".join(report.speculative_types) or None)


def _override_blocks(report: LaunchReport, tensor: re.Pattern[str]) -> tuple[int, ...] | None:
    if not report.overrides:
        return None
    return tuple(sorted({o.block for o in report.overrides
                         if o.block is not None and tensor.search(o.tensor)}))


def _first_blocks(key: str, tensor: re.Pattern[str]) -> _Comparer:
    def check(value: object, report: LaunchReport) -> _Check:
        n = _int(value, key)
        blocks = _override_blocks(report, tensor)
        if blocks is None:
            return _Check(n, None, "no 'buffer type overridden' lines (they need -lv 5)")
        # Blocks without such tensors (a dense leading block) are not overridden, so the
        # check is that every overridden block is one of the first n, and some are.
        return _Check(n, blocks, f"the first {n} blocks' tensors go to the CPU",
                      ok=bool(blocks) and max(blocks) < n)
    return check


def _cpu_moe(value: object, report: LaunchReport) -> _Check:
    if value is False:
        # LaunchSpec's default: the switch is simply not passed.
        return _Check(False, False)
    blocks = _override_blocks(report, _EXPERT_TENSOR)
    return _Check(bool(value), bool(blocks) if blocks is not None else None)


def _field(name: str) -> _Comparer:
    def check(value: object, report: LaunchReport) -> _Check:
        return _Check(value, getattr(report, name))
    return check


def _mtp_context(value: object, report: LaunchReport) -> _Check:
    return _Check(value, report.mtp_context_created)


def _override_count(value: object, report: LaunchReport) -> _Check:
    return _Check(value, len(report.overrides))


_NO_DRAFT_PARAMS = ("no '- n_max=…, n_min=…, p_min=…' line: no draft implementation was set up "
                    "(common/speculative.cpp prints one per draft-* implementation)")


def _draft_value(report: LaunchReport, name: str) -> object:
    """One draft parameter as every draft implementation printed it; a tuple if they differ."""
    values = sorted({getattr(params, name) for params in report.draft_params})
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _draft_count(key: str, name: str) -> _Comparer:
    def check(value: object, report: LaunchReport) -> _Check:
        observed = _draft_value(report, name)
        return _Check(_int(value, key), observed, "" if report.draft_params else _NO_DRAFT_PARAMS)
    return check


def _as_float32(value: float) -> float:
    """``value`` as common/arg.cpp stores it (``std::stof`` into a float)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _spec_draft_p_min(value: object, report: LaunchReport) -> _Check:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"compare_launch: spec_draft_p_min must be a number, got {value!r}")
    printed = _draft_value(report, "p_min")
    if not isinstance(printed, Decimal):
        return _Check(value, printed, "" if report.draft_params else _NO_DRAFT_PARAMS)
    # The line rounds to its own decimals (%f or %.2f), so the plan is compared at that
    # precision: 0.125 is printed 0.12 by draft-mtp, as printf rounds the stored float.
    decimals = -int(printed.as_tuple().exponent)
    want = f"{_as_float32(float(value)):.{decimals}f}"
    return _Check(value, float(printed), f"printed with {decimals} decimals as {printed}",
                  ok=want == str(printed))


def _checkpoint_min_step(value: object, report: LaunchReport) -> _Check:
    step = _int(value, "checkpoint_min_step")
    detail = ("context checkpoints disabled: load_model prints no spacing"
              if report.ctx_checkpoints == 0 else "")
    return _Check(step, report.checkpoint_min_step, detail)


#: The load modes that lock the weights in RAM (src/llama-model.cpp ``load_tensors``:
#: ``use_mlock``); whether the file was mapped is read from the buffers instead.
_MLOCK_MODES = frozenset({LoadMode.MLOCK, LoadMode.MMAP_MLOCK})


def _effective_load_mode(report: LaunchReport) -> LoadMode | None:
    """The mode the weights were loaded with, from what the load did rather than its echo:
    mmap is a ``*_Mapped`` model buffer, mlock a lock mode with no mlock failure."""
    printed, mapped = report.load_mode, report.weights_mapped
    if printed is None or mapped is None:
        return None
    locked = printed in _MLOCK_MODES and not report.mlock_failures
    if mapped:
        return LoadMode.MMAP_MLOCK if locked else LoadMode.MMAP
    if locked:
        return LoadMode.MLOCK
    # Direct I/O leaves no trace of its own beyond the echo; without mmap it reads like none.
    return LoadMode.DIO if printed is LoadMode.DIO else LoadMode.NONE


def _load_mode(value: object, report: LaunchReport) -> _Check:
    planned = LoadMode(str(getattr(value, "value", value)))
    observed = _effective_load_mode(report)
    if observed is None:
        return _Check(planned.value, None,
                      "no 'load_tensors: … (load_mode = …)' or model buffer line")
    printed = report.load_mode
    mapped = "in a mapped buffer" if report.weights_mapped else "in an unmapped buffer"
    detail = f"load_tensors printed load_mode = {printed}, weights {mapped}"
    if report.mlock_failures:
        detail += f"; {report.mlock_failures[0]}"
    want = planned
    if planned is LoadMode.AUTO:
        # auto: mmap unless a device cannot map; load_tensors prints what it resolved to.
        want = LoadMode.MMAP if printed is LoadMode.MMAP else LoadMode.NONE
    return _Check(want.value, observed.value, detail,
                  ok=observed is want and printed in (want, planned))


_NO_GPU_LINE = "no 'offloaded N/M layers to GPU' line (a build without GPU)"


def _kv_offload(value: object, report: LaunchReport) -> _Check:
    planned = bool(value)
    offloaded = report.target.offloaded_layers if report.target else None
    if offloaded is None:
        return _Check(planned, None, _NO_GPU_LINE)
    # llama_kv_cache puts a layer's cache on that layer's device (model.dev_layer) when
    # offload is on, else on the CPU; of N offloaded layers one is the output layer
    # (load_tensors "offloading output layer to GPU"), so repeating layers are on the GPU
    # only when N > 1.
    repeating_on_gpu = offloaded[0] > 1
    want = planned and repeating_on_gpu
    detail = ("" if want == planned
              else f"{offloaded[0]}/{offloaded[1]} offloaded: no repeating layer, so no KV, is "
                   "on the GPU")
    return _Check(want, report.kv_on_gpu, detail)


def _observed_split_mode(report: LaunchReport) -> tuple[frozenset[SplitMode], str] | None:
    """The split modes the device lines allow, and why; None when no GPU device is named."""
    target = report.target
    if target is not None and target.tensor_split_devices is not None:
        return frozenset({SplitMode.TENSOR}), (
            f"a Meta device over {target.tensor_split_devices} devices")
    # Row split puts matrices in the backend's split buffer type (make_gpu_buft_list). In
    # the pinned source only SYCL (``SYCL_Split``) has one; CUDA, ROCm and Vulkan refuse
    # the load ("does not support split buffers"), which fails the start instead.
    if target is not None and any(buf.buffer.endswith("_Split") for buf in target.model_buffers):
        return frozenset({SplitMode.ROW}), "a *_Split model buffer"
    gpus = report.gpu_devices
    if not gpus:
        return None
    if len(gpus) > 1:
        return frozenset({SplitMode.LAYER}), f"{len(gpus)} GPU devices: {', '.join(gpus)}"
    # One device: llama_prepare_model_devices keeps only the main GPU for none, and a
    # machine with one GPU gives layer the same single device.
    return frozenset({SplitMode.NONE, SplitMode.LAYER}), (
        f"one GPU device ({gpus[0]}): none and layer place the model alike")


def _split_mode(value: object, report: LaunchReport) -> _Check:
    planned = SplitMode(str(getattr(value, "value", value)))
    seen = _observed_split_mode(report)
    if seen is None:
        return _Check(planned.value, None, "no GPU 'using device' line (a build without GPU)")
    modes, why = seen
    observed = "|".join(sorted(m.value for m in modes))
    return _Check(planned.value, observed, why, ok=planned in modes)


def _main_gpu(value: object, report: LaunchReport) -> _Check:
    index = _int(value, "main_gpu")
    gpus = report.gpu_devices
    if len(gpus) != 1:
        return _Check(index, None, f"{len(gpus)} GPU 'using device' lines: --main-gpu picks "
                      "the one device only with --split-mode none")
    # llama_prepare_model_devices keeps devices[main_gpu] of the build's GPUs in registry
    # order, which ggml names <backend>0, <backend>1, … (one GPU backend, no RPC servers).
    found = _GPU_DEVICE.match(gpus[0])
    observed = int(found["index"]) if found else None
    return _Check(index, observed, f"the model's one device is {gpus[0]}")


_COMPARERS: dict[str, _Comparer] = {
    "ctx_size": _ctx_size,
    "parallel": _field("n_slots"),
    "batch_size": _batch_size,
    "ubatch_size": _ubatch_size,
    "cache_type_k": _field("type_k"),
    "cache_type_v": _field("type_v"),
    "flash_attn": _flash_attn,
    "n_gpu_layers": _n_gpu_layers,
    "drafter": _drafter,
    "spec_type": _spec_type,
    "n_cpu_moe": _first_blocks("n_cpu_moe", _EXPERT_TENSOR),
    "n_cpu_ffn": _first_blocks("n_cpu_ffn", _DENSE_FFN_TENSOR),
    "cpu_moe": _cpu_moe,
    "n_ctx": _field("n_ctx"),
    "n_ctx_seq": _field("n_ctx_seq"),
    "n_batch": _field("n_batch"),
    "n_ubatch": _field("n_ubatch"),
    "n_slots": _field("n_slots"),
    "type_k": _field("type_k"),
    "type_v": _field("type_v"),
    "flash_attn_effective": _field("flash_attn"),
    "drafter_loaded": _field("drafter_loaded"),
    "mtp_context": _mtp_context,
    "speculative_ready": _field("speculative_ready"),
    "overrides": _override_count,
    "spec_draft_n_min": _draft_count("spec_draft_n_min", "n_min"),
    "spec_draft_n_max": _draft_count("spec_draft_n_max", "n_max"),
    "spec_draft_p_min": _spec_draft_p_min,
    "ctx_checkpoints": _field("ctx_checkpoints"),
    "checkpoint_min_step": _checkpoint_min_step,
    "load_mode": _load_mode,
    "kv_offload": _kv_offload,
    "split_mode": _split_mode,
    "main_gpu": _main_gpu,
}


def comparable_fields() -> Sequence[str]:
    """The keys ``compare_launch`` accepts."""
    return tuple(sorted(_COMPARERS))


#: Planned fields a CPU build cannot show, and why. It registers no GPU device, so
#: llama_prepare_model_devices prints no ``using device`` line and load_tensors no
#: ``offloaded N/M layers to GPU`` line; every buffer is a CPU one.
CPU_UNVERIFIABLE: Mapping[str, str] = MappingProxyType({
    "n_gpu_layers": "a CPU build has no GPU to offload to: load_tensors prints no "
                    "'offloaded N/M layers to GPU' line",
    "split_mode": "a CPU build lists no GPU device (no 'using device' line from "
                  "llama_prepare_model_devices): there is nothing to split the model over",
    "main_gpu": "a CPU build lists no GPU device (no 'using device' line from "
                "llama_prepare_model_devices): there is no main GPU to pick",
    "kv_offload": "on a CPU build llama_kv_cache puts every layer's cache on the CPU with or "
                  "without --no-kv-offload: the 'KV buffer size' line says CPU either way",
})

#: The speculative types whose implementations take and print the draft sizes
#: (common/speculative.cpp: the draft-* family; the ngram ones have sizes of their own).
_DRAFT_TYPE_PREFIX = "draft-"
_DRAFT_FIELDS = ("spec_draft_n_min", "spec_draft_n_max", "spec_draft_p_min")


class UnverifiedField(UserWarning):
    """A planned field was sent but the server under test cannot show it (reason given).

    Defined here, not in the suite: pytest-xdist's controller re-creates a worker's
    warning by importing its class's module, and a test module is not importable there.
    """


def unverifiable(expected: Mapping[str, object], backend: Backend) -> dict[str, str]:
    """The planned fields of ``expected`` (``compare_launch`` keys) that a ``backend`` build's
    server cannot show for this plan, each with the reason; ``compare_launch`` would call
    them mismatches. Unplanned (None) fields are not listed.
    """
    planned = {key: value for key, value in expected.items() if value is not None}
    found: dict[str, str] = {}
    if backend is Backend.CPU:
        found.update({key: why for key, why in CPU_UNVERIFIABLE.items() if key in planned})
    spec_types = str(planned.get("spec_type") or "none").split(",")
    if not any(t.startswith(_DRAFT_TYPE_PREFIX) for t in spec_types):
        why = (f"spec type {','.join(spec_types)} runs no draft-* implementation, so no "
               "'- n_max=…, n_min=…, p_min=…' line is printed and nothing uses the draft sizes")
        found.update({key: why for key in _DRAFT_FIELDS if key in planned})
    if planned.get("ctx_checkpoints") == 0 and "checkpoint_min_step" in planned:
        found["checkpoint_min_step"] = ("--ctx-checkpoints 0 disables checkpoints: load_model "
                                        "prints 'context checkpoints disabled', no spacing")
    split = str(getattr(planned.get("split_mode"), "value", planned.get("split_mode")))
    if "main_gpu" in planned and "main_gpu" not in found and split != SplitMode.NONE.value:
        found["main_gpu"] = (f"--split-mode {planned.get('split_mode') or 'layer (default)'}: "
                             "llama_prepare_model_devices applies --main-gpu only with "
                             "--split-mode none")
    return found
