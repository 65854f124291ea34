"""What one model block of a startup log says about its model and context (pure).

``parse_block`` reads a ``log_blocks.LogBlock`` into a frozen ``BlockReport``. Lines read,
with the function that prints them (pinned source):

- ``llama_model_load_from_file_impl`` → src/llama.cpp ``llama_prepare_model_devices``:
  ``using device CUDA0 (NVIDIA …) (0000:01:00.0) - 23592 MiB free``
- src/llama-model.cpp ``load_tensors``: ``offloaded %d/%d layers to GPU`` (only when a GPU
  device is registered) and ``%12s model buffer size = %8.2f MiB`` per buffer
- src/llama-model-loader.cpp (``-lv 5``, DEBUG): ``tensor %s (%zu MiB %s) buffer type
  overridden to %s``
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
- allocation failures: ggml/src/ggml-backend.cpp ``ggml_backend_buft_alloc_buffer_n_default``
  (``failed to allocate %s buffer of size %zu``), ggml/src/ggml-cuda/ggml-cuda.cu
  ``ggml_backend_cuda_buffer_type_alloc_buffer`` (``allocating %.2f MiB on device %d:
  cudaMalloc failed: %s``), ggml/src/ggml-vulkan/ggml-vulkan-buffers.cpp
  ``ggml_vk_create_buffer_device`` (``ggml_vulkan: Device memory allocation of size … failed.``),
  src/llama-model.cpp ``load_tensors`` (``unable to allocate %s buffer``)
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from decimal import Decimal

from harness.facts.gpu import LoadMode
from harness.verdicts.kv_log import KvLogLine, parse_kv_cache_lines
from harness.verdicts.log_blocks import BlockKind, BlockRole, LogBlock, first_group, message


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


#: A buffer made from a host pointer is named ``*_Mapped`` (ggml/src/ggml-backend.cpp
#: ``ggml_backend_cpu_buffer_from_ptr_type_get_name``: ``CPU_Mapped``; Metal's
#: ``MTL0_Mapped``); load_tensors makes one only on the mmap path.
_MAPPED_SUFFIX = "_Mapped"
#: A device of a GPU backend, or a buffer on one: the backend's name and an index (the names
#: ``harness.verdicts.gpu_signals.GpuBackend`` lists; host buffers such as ``CUDA_Host`` and
#: ``CPU`` do not match). llama.cpp's RPC devices count too: ``RPC0`` in a ``using device``
#: line, and every RPC buffer labelled ``RPC<n>[<endpoint>]`` (ggml-rpc names each
#: server's buffer type so). Kept here, not taken from gpu_use, because gpu_use imports this
#: module; ``placement_checks`` reads ``--main-gpu``'s index from it.
GPU_DEVICE_NAME = re.compile(
    r"^(?:CUDA|ROCm|Vulkan|SYCL|MTL|RPC)(?P<index>\d+)(?:\[(?P<endpoint>[^\]]+)\])?$")


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
    #: ``-lv 5``'s ``layer N assigned to device NAME`` lines as (N, NAME); layer ``n_layer``
    #: is the output layer. Empty at lower verbosity.
    layer_devices: tuple[tuple[int, str], ...] = ()

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
        return tuple(d.name for d in self.devices if GPU_DEVICE_NAME.match(d.name))

    @property
    def kv_on_gpu(self) -> bool | None:
        """Whether any ``KV buffer size`` line names a GPU buffer; None without KV lines."""
        if not self.kv_buffers:
            return None
        return any(GPU_DEVICE_NAME.match(buf.buffer) for buf in self.kv_buffers)

    @property
    def has_context(self) -> bool:
        return self.n_ctx is not None


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
_LAYER_DEVICE = re.compile(r"load_tensors: layer\s+(?P<layer>\d+) assigned to device "
                           r"(?P<device>[^\s,]+)")
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
    mode = first_group(_FLASH_MODE, messages, "mode")
    flash_mode = FlashAttnMode(mode) if mode else None
    resolved = first_group(_FA_RESOLVED, messages, "how")
    unified = first_group(_KV_UNIFIED, messages, "value")
    offloaded = next((found for text in messages if (found := _OFFLOADED.search(text))), None)
    n_ctx_train = first_group(_N_CTX_TRAIN, messages, "value")
    load_mode = first_group(_LOAD_MODE, messages, "mode")
    tensor_split = first_group(_TENSOR_SPLIT, messages, "n")
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
        flash_attn_forced=first_group(_FA_FORCED, messages, "why"),
        kv_caches=parse_kv_cache_lines("\n".join(messages)),
        kv_buffers=tuple(_buffers(_KV_BUFFER, messages)),
        compute_buffers=tuple(_buffers(_COMPUTE_BUFFER, messages)),
        alloc_failures=tuple(_alloc_failures(messages)),
        load_mode=LoadMode(load_mode) if load_mode else None,
        tensor_split_devices=int(tensor_split) if tensor_split else None,
        layer_devices=tuple((int(found["layer"]), found["device"]) for text in messages
                            if (found := _LAYER_DEVICE.search(text))),
    )


def _effective_flash_attn(mode: FlashAttnMode | None, resolved: str | None) -> bool | None:
    if mode is FlashAttnMode.ENABLED:
        return True
    if mode is FlashAttnMode.DISABLED:
        return False
    # auto: resolve_fused_ops decides while reserving the graph; no line, no decision.
    return None if resolved is None else resolved == "enabled"


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
