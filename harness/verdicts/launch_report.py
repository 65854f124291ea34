"""The effective launch, read from a llama-server startup log (pure: text in, frozen data out).

``parse_launch_log`` cuts the log into its model blocks (``log_blocks``), parses each
(``block_report``) and adds what the server says once for the whole launch. Those
launch-wide lines, with the function that prints them (pinned source):

- src/llama-model-loader.cpp: once per process the WARN ``tensor overrides to CPU are used
  with mmap enabled``
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
- tools/server/server-context.cpp ``load_model``: ``initializing, n_slots = %d, n_ctx_slot =
  %d, kv_unified = '%s'``, ``speculative decoding context initialized``, ``failed to
  initialize speculative decoding context: %s``, ``failed to load draft model``, ``failed
  to create MTP context``
- common/speculative.cpp: ``loading draft model '%s'``, ``adding speculative implementation
  '%s'``
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal

from harness.facts.gpu import LoadMode
from harness.verdicts.block_report import (
    BlockReport,
    FlashAttnMode,
    TensorOverride,
    parse_block,
)
from harness.verdicts.kv_log import KvLogLine
from harness.verdicts.log_blocks import (
    DRAFT_MODEL_LINE,
    OLD_SLOTS_LINE,
    SLOTS_LINE,
    BlockKind,
    BlockRole,
    first_group,
    message,
    split_blocks,
)


@dataclass(frozen=True)
class DraftParams:
    """One draft implementation's ``- n_max=%d, n_min=%d, p_min=…`` line (speculative.cpp)."""

    n_max: int
    n_min: int
    #: As printed: six decimals (``%f``) or two (``%.2f``), depending on the implementation.
    p_min: Decimal


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
    #: ``tensor NAME (size = N MiB) lazy read enabled`` in the target's block: the tensors
    #: the loader reads on demand from the file (src/llama-model-loader.cpp).
    lazy_tensors: tuple[str, ...] = ()
    #: The vision projector: ``loaded multimodal model, '<path>'`` (tools/server), the
    #: backend it runs on (``CLIP using <backend> backend``) and its ``model size`` plus
    #: ``metadata size`` in MiB (tools/mtmd/clip.cpp ``load_hparams``), as printed.
    projector_path: str | None = None
    projector_backend: str | None = None
    projector_mib: Decimal | None = None

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
        if self.target is None:
            return None
        if self.lazy_tensors and any(b.buffer == "CPU" for b in self.target.model_buffers):
            # The lazily read tensors' context is mapped whatever the load mode
            # (src/llama-model.cpp); a plain CPU buffer beside it holds the rest, unmapped.
            return False
        return self.target.weights_mapped

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


def _single(values: set[str]) -> str | None:
    return next(iter(values)) if len(values) == 1 else None


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
_PROJECTOR_LOADED = re.compile(r"loaded multimodal model, '(?P<path>[^']*)'")
_PROJECTOR_BACKEND = re.compile(r"CLIP using (?P<backend>\S+) backend")
_PROJECTOR_SIZE = re.compile(r"load_hparams: +(?:model|metadata) size: +(?P<mib>[\d.]+) MiB")
_LAZY_READ = re.compile(r"tensor (?P<name>\S+) \(size = \d+ MiB\) lazy read enabled")
_MLOCK_FAILED = re.compile(
    r"(?P<error>warning: (?:failed to (?:mlock|VirtualLock) \d+-byte buffer|"
    r"mlock not supported on this system).*?)\s*$")


#: Older releases' per-slot line, and the line that says whether the slots share one KV
#: cache (printed when ``--parallel`` is left to the server).
_OLD_SLOT_CTX = re.compile(r"new slot, n_ctx = (?P<ctx>\d+)")
_AUTO_UNIFIED = re.compile(r"using n_parallel = \d+ and kv_unified = (?P<unified>true|false)")


def _slots(texts: list[str]) -> tuple[int | None, int | None, bool | None]:
    """The server's slots: count, context of each, whether they share one KV cache; from
    today's one line, else from the older releases' lines (kv_unified only where the
    server chose the slot count)."""
    if found := next((f for text in texts if (f := SLOTS_LINE.search(text))), None):
        return int(found["slots"]), int(found["ctx"]), found["unified"] == "true"
    count = first_group(OLD_SLOTS_LINE, texts, "slots")
    ctx = first_group(_OLD_SLOT_CTX, texts, "ctx")
    unified = first_group(_AUTO_UNIFIED, texts, "unified")
    return (int(count) if count else None, int(ctx) if ctx else None,
            None if unified is None else unified == "true")


def parse_launch_log(log: str) -> LaunchReport:
    """Everything the startup log says about the launch; absent lines leave fields None."""
    raw = split_blocks(log)
    blocks = [parse_block(block) for block in raw]
    target_lines = next((b.lines for b in raw if b.role is BlockRole.TARGET), ())
    target = next((b for b in blocks if b.role is BlockRole.TARGET), None)
    drafter = next((b for b in blocks if b.role is BlockRole.DRAFTER), None)
    texts = [message(line) for line in log.splitlines()]
    n_slots, n_ctx_slot, unified = _slots(texts)
    draft_path = first_group(DRAFT_MODEL_LINE, texts, "path")
    checkpoints = next((found for text in texts if (found := _CHECKPOINTS_ON.search(text))),
                       None)
    disabled = any(_CHECKPOINTS_OFF.search(text) for text in texts)
    return LaunchReport(
        target=target,
        drafter=drafter,
        n_slots=n_slots,
        n_ctx_slot=n_ctx_slot,
        slots_kv_unified=unified,
        drafter_path=draft_path,
        speculative_types=tuple(found["type"] for text in texts
                                if (found := _SPEC_TYPE.search(text))),
        speculative_ready=any(_SPEC_READY.search(text) for text in texts),
        speculative_error=first_group(_SPEC_ERROR, texts, "error"),
        cpu_override_warning=any(_CPU_OVERRIDE_WARNING.search(text) for text in texts),
        draft_params=tuple(DraftParams(int(found["n_max"]), int(found["n_min"]),
                                       Decimal(found["p_min"]))
                           for text in texts if (found := _DRAFT_PARAMS.search(text))),
        ctx_checkpoints=int(checkpoints["max"]) if checkpoints else (0 if disabled else None),
        checkpoint_min_step=int(checkpoints["step"]) if checkpoints else None,
        mlock_failures=tuple(found["error"] for text in texts
                             if (found := _MLOCK_FAILED.search(text))),
        lazy_tensors=tuple(found["name"] for line in target_lines
                           if (found := _LAZY_READ.search(message(line)))),
        projector_path=first_group(_PROJECTOR_LOADED, texts, "path"),
        projector_backend=first_group(_PROJECTOR_BACKEND, texts, "backend"),
        projector_mib=_projector_mib(texts),
    )


def _projector_mib(texts: list[str]) -> Decimal | None:
    sizes = [Decimal(found["mib"]) for text in texts if (found := _PROJECTOR_SIZE.search(text))]
    return sum(sizes, Decimal(0)) if sizes else None
