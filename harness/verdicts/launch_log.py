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
returns every field that differs.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath

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

    @property
    def model_buffers_mib(self) -> dict[str, Decimal]:
        """Model weights per buffer (``CPU_Mapped``, ``CUDA0``, …), summed over repeats."""
        return _sum_by_buffer(self.model_buffers)

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


def parse_launch_log(log: str) -> LaunchReport:
    """Everything the startup log says about the launch; absent lines leave fields None."""
    blocks = [parse_block(block) for block in split_blocks(log)]
    target = next((b for b in blocks if b.role is BlockRole.TARGET), None)
    drafter = next((b for b in blocks if b.role is BlockRole.DRAFTER), None)
    slots = next((found for line in log.splitlines() if (found := _SLOTS.search(line))), None)
    texts = [message(line) for line in log.splitlines()]
    draft_path = _first(_DRAFT_MODEL, texts, "path")
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
    ``drafter``, ``spec_type``, ``n_cpu_moe``, ``cpu_moe``, ``n_cpu_ffn``) or report names
    (``n_ctx``, ``n_ctx_seq``, ``n_batch``, ``n_ubatch``, ``n_slots``, ``type_k``,
    ``type_v``, ``flash_attn_effective``, ``drafter_loaded``, ``mtp_context``,
    ``speculative_ready``, ``overrides``). A None value (and ``cpu_moe`` False, LaunchSpec's
    default) is not planned and is skipped. Raises ValueError for an unknown key.
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
}


def comparable_fields() -> Sequence[str]:
    """The keys ``compare_launch`` accepts."""
    return tuple(sorted(_COMPARERS))
