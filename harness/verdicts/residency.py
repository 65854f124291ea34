"""How much of each model really sits on the GPU, and whether that is what the plan asked for.

Pure: log text and planning values in, frozen dataclasses out. The figure is the one
``ollama ps`` shows as "48%/52% CPU/GPU", but read from the server's own lines, per model
block (target, drafter; the blocks are cut by ``log_blocks.split_blocks``):

- src/llama-model.cpp ``llama_model_base::load_tensors``: ``%12s model buffer size = %8.2f
  MiB`` once per weight buffer, named by ``ggml_backend_buffer_name`` — ``CUDA0``,
  ``ROCm0``, ``Vulkan0``, … for device memory; ``CPU_Mapped`` (ggml/src/ggml-backend.cpp
  ``ggml_backend_cpu_buffer_from_ptr_type_get_name``: the mmap'd file), ``CPU``, ``CPU_REPACK``
  (ggml/src/ggml-cpu/repack.cpp), ``CPU_KLEIDIAI``, ``AMX`` and ``<Backend>_Host``
  (pinned host memory, e.g. ggml-cuda.cu ``ggml_backend_cuda_host_buffer_type_name``) for
  host memory; and ``offloaded %d/%d layers to GPU``;
- src/llama-kv-cache.cpp ``llama_kv_cache::llama_kv_cache``: ``%10s KV buffer size = %8.2f
  MiB`` once per KV buffer.

An MTP draft context has no weights of its own (it runs on the target's), so its block
holds KV only and has no share. A software device (Vulkan on llvmpipe) counts as a GPU
here, as its buffers are the device's; ``gpu_use`` is what names it a software device.

``residency_verdict`` compares that with the share the plan's offload flags put on the GPU
(``planned_share.planned_gpu_share``): device bytes against the planned device bytes
(see ``tolerance_bytes`` for why device bytes and not the host figure) and warns, with
both shares, when more of the weights stay in host memory than planned — a log may say
``offloaded 49/49 layers to GPU`` while most of a MoE model's bytes sit in ``CPU_Mapped``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

from harness.planning.planned_share import MIB, PlannedShare
from harness.verdicts.block_report import BlockReport, BufferSize, parse_block
from harness.verdicts.gpu_use import gpu_backend_of
from harness.verdicts.log_blocks import BlockKind, BlockRole, split_blocks


class Place(enum.StrEnum):
    """Where a buffer's memory is, by ggml's buffer name (see the module docstring)."""

    GPU = "gpu"
    HOST = "host"
    #: A name this module does not know (an RPC server, a new backend): counted in neither.
    OTHER = "other"


#: ggml's host-side buffer names: the CPU backend's own (ggml-backend.cpp, ggml-cpu/) and
#: every GPU backend's pinned host buffer type, ``GGML_<X>_NAME "_Host"``.
_HOST_NAME = re.compile(r"^(?:CPU(?:_[A-Za-z]+)?|AMX|[A-Za-z]+_Host)$")
#: Metal maps the model file straight into device-visible memory on unified-memory Macs
#: (ggml/src/ggml-metal/ggml-metal.cpp: ``MTL<i>_Mapped``): the GPU's buffer.
_MAPPED_GPU_NAME = re.compile(r"^MTL\d+_Mapped$")


def place_of(buffer: str) -> Place:
    """GPU, host or unknown memory for a ggml buffer name (``CUDA0``, ``CUDA_Host``, …)."""
    if gpu_backend_of(buffer) is not None or _MAPPED_GPU_NAME.match(buffer):
        return Place.GPU
    if _HOST_NAME.match(buffer):
        return Place.HOST
    return Place.OTHER


# --- what the log says -----------------------------------------------------------------------


@dataclass(frozen=True)
class Holding:
    """MiB one buffer holds, as printed (``%8.2f``), summed over repeated lines of one name."""

    buffer: str
    place: Place
    mib: Decimal


@dataclass(frozen=True)
class BlockResidency:
    """Where one block's weights and KV cache are, from its buffer lines."""

    role: BlockRole
    kind: BlockKind
    weights: tuple[Holding, ...]
    kv: tuple[Holding, ...]
    #: ``offloaded N/M layers to GPU`` as (N, M); absent on a build with no GPU device.
    offloaded_layers: tuple[int, int] | None

    def _sum(self, holdings: tuple[Holding, ...], place: Place) -> Decimal:
        # Started at 0.00 so that an empty sum prints like the server's own figures.
        return sum((h.mib for h in holdings if h.place is place), Decimal("0.00"))

    @property
    def weights_gpu_mib(self) -> Decimal:
        return self._sum(self.weights, Place.GPU)

    @property
    def weights_host_mib(self) -> Decimal:
        return self._sum(self.weights, Place.HOST)

    @property
    def kv_gpu_mib(self) -> Decimal:
        return self._sum(self.kv, Place.GPU)

    @property
    def kv_host_mib(self) -> Decimal:
        return self._sum(self.kv, Place.HOST)

    @property
    def has_weights(self) -> bool:
        return self.weights_gpu_mib + self.weights_host_mib > 0

    @property
    def cpu_percent(self) -> int | None:
        """Whole percent of the weights in host memory; None without weights (MTP context)."""
        total = self.weights_gpu_mib + self.weights_host_mib
        if total <= 0:
            return None
        return int((self.weights_host_mib * 100 / total).quantize(Decimal(1), ROUND_HALF_UP))

    @property
    def gpu_percent(self) -> int | None:
        cpu = self.cpu_percent
        return None if cpu is None else 100 - cpu

    @property
    def processor(self) -> str | None:
        """``ollama ps``'s PROCESSOR words: ``100% GPU``, ``100% CPU`` or ``17%/83% CPU/GPU``."""
        cpu = self.cpu_percent
        if cpu is None:
            return None
        if self.weights_host_mib == 0:
            return "100% GPU"
        if self.weights_gpu_mib == 0:
            return "100% CPU"
        return f"{cpu}%/{100 - cpu}% CPU/GPU"


def _holdings(buffers: Iterable[BufferSize]) -> tuple[Holding, ...]:
    total: dict[str, Decimal] = {}
    for buf in buffers:
        total[buf.buffer] = total.get(buf.buffer, Decimal(0)) + buf.mib
    return tuple(Holding(name, place_of(name), mib) for name, mib in total.items())


def block_residency(block: BlockReport) -> BlockResidency:
    """The residency of one parsed block (``block_report.parse_block``)."""
    return BlockResidency(block.role, block.kind, _holdings(block.model_buffers),
                          _holdings(block.kv_buffers), block.offloaded_layers)


def residency(log: str) -> tuple[BlockResidency, ...]:
    """Every block's residency, target first; () when the log has no model block."""
    return tuple(block_residency(parse_block(block)) for block in split_blocks(log))


# --- planned against observed ----------------------------------------------------------------

#: ``%8.2f`` MiB: a printed buffer is within half a hundredth of a MiB of its size.
HALF_PRINTED_UNIT_BYTES = MIB // 200
#: Allocation padding allowed per layer on the GPU. A device buffer is the sum of its
#: tensors, each padded to the buffer type's alignment (ggml-cuda.cu: 128 B; Vulkan's
#: minStorageBufferOffsetAlignment, at most 256 B by the Vulkan spec) and, for a quantized
#: CUDA matrix, its last row padded to MATRIX_ROW_PADDING (512) elements — under 1 KiB a
#: tensor for every type up to 8 bits. A block has about 9 (llama) to 16 (a MoE block
#: with router, shared experts and biases) tensors, and llama.cpp loads ``rope_freqs``
#: once more per block (``TENSOR_DUPLICATED``): 16 KiB a layer covers them. Next to a
#: real model (hundreds of MiB a layer) that is nothing; for the tiny fixtures (a dense
#: block is ~0.17 MiB, a MoE block's experts 0.19 MiB) it is still well under one block,
#: the smallest thing a flag moves.
LAYER_PAD_BYTES = 16 * 1024


def tolerance_bytes(planned: PlannedShare, gpu_buffers: int) -> int:
    """How far the printed GPU bytes may sit from the planned ones and still be the plan.

    The check is on device bytes because they are exact allocations. The host figure is
    not: a ``CPU_Mapped`` buffer spans the file from its first tensor to its last
    (src/llama-model-loader.cpp ``get_mapping_range``), GPU tensors in between included —
    with ``--n-cpu-moe 1`` it holds ``token_embd``, all of block 0 and block 0's experts.
    """
    return (HALF_PRINTED_UNIT_BYTES * max(1, gpu_buffers)
            + LAYER_PAD_BYTES * planned.gpu_layers)


class ShareOutcome(enum.StrEnum):
    """How the GPU bytes of a block compare with its plan."""

    AS_PLANNED = "as-planned"
    #: Fewer bytes on the GPU than planned: more stayed in host memory.
    MORE_ON_HOST = "more-on-host"
    #: More on the GPU than planned: a planned CPU override did not apply.
    MORE_ON_GPU = "more-on-gpu"
    #: The block printed no weight buffer (it failed before, or is an MTP context).
    NO_BUFFERS = "no-buffers"


@dataclass(frozen=True)
class ShareCheck:
    """One block's observed GPU bytes against its planned share."""

    role: BlockRole
    planned: PlannedShare
    observed_gpu_mib: Decimal
    observed_host_mib: Decimal
    observed_processor: str | None
    tolerance_mib: Decimal
    outcome: ShareOutcome
    message: str


def check_share(observed: BlockResidency, planned: PlannedShare) -> ShareCheck:
    """``observed``'s device bytes against ``planned`` within ``tolerance_bytes``."""
    gpu_buffers = sum(1 for h in observed.weights if h.place is Place.GPU)
    tolerance = Decimal(tolerance_bytes(planned, gpu_buffers)) / MIB
    low = Decimal(planned.gpu_bytes) / MIB
    high = Decimal(planned.gpu_bytes + planned.unplaced_bytes) / MIB
    gpu, host = observed.weights_gpu_mib, observed.weights_host_mib
    role = observed.role.value
    seen = (f"observed {observed.processor} ({gpu} MiB on the GPU, {host} MiB in host "
            "memory)")
    if not observed.has_weights:
        outcome = ShareOutcome.NO_BUFFERS
        message = (f"{role}: no weight buffers in the log to hold against planned "
                   f"{planned.describe()}")
    elif gpu < low - tolerance:
        outcome = ShareOutcome.MORE_ON_HOST
        message = (f"{role}: more of the weights in host memory than planned: planned "
                   f"{planned.describe()}, {seen}")
    elif gpu > high + tolerance:
        outcome = ShareOutcome.MORE_ON_GPU
        message = (f"{role}: more of the weights on the GPU than planned (a CPU override "
                   f"did not apply?): planned {planned.describe()}, {seen}")
    else:
        outcome = ShareOutcome.AS_PLANNED
        message = f"{role}: as planned, {planned.describe()}; {seen}"
    return ShareCheck(observed.role, planned, gpu, host, observed.processor,
                      tolerance.quantize(Decimal("0.001")), outcome, message)


@dataclass(frozen=True)
class ResidencyVerdict:
    """Every block's residency, each planned block's check, and the warnings they raise."""

    blocks: tuple[BlockResidency, ...]
    checks: tuple[ShareCheck, ...]
    warnings: tuple[str, ...]

    def block(self, role: BlockRole) -> BlockResidency | None:
        return next((b for b in self.blocks if b.role is role), None)

    def check(self, role: BlockRole) -> ShareCheck | None:
        return next((c for c in self.checks if c.role is role), None)


def residency_verdict(log: str, planned: Mapping[BlockRole, PlannedShare] | None = None,
                      ) -> ResidencyVerdict:
    """The residency of ``log``'s blocks, checked against ``planned`` where it has a block.

    Warnings: a block whose GPU bytes are off its plan (either way), a planned block the
    log does not have, and a buffer whose name says neither GPU nor host.
    """
    blocks = residency(log)
    checks: list[ShareCheck] = []
    warnings: list[str] = []
    for block in blocks:
        for holding in (*block.weights, *block.kv):
            if holding.place is Place.OTHER:
                warnings.append(f"{block.role.value}: buffer {holding.buffer} "
                                f"({holding.mib} MiB) is neither a known GPU nor host buffer")
    for role, share in (planned or {}).items():
        found = next((b for b in blocks if b.role is role), None)
        if found is None:
            warnings.append(f"{role.value}: planned {share.describe()}, but the log has no "
                            f"{role.value} block")
            continue
        check = check_share(found, share)
        checks.append(check)
        if check.outcome is not ShareOutcome.AS_PLANNED:
            warnings.append(check.message)
    return ResidencyVerdict(blocks, tuple(checks), tuple(warnings))


def residency_json(verdict: ResidencyVerdict) -> dict[str, object]:
    """The verdict as plain JSON (MiB as the printed decimal strings)."""
    return {
        "blocks": [{
            "role": b.role.value,
            "kind": b.kind.value,
            "weights_mib": {h.buffer: str(h.mib) for h in b.weights},
            "kv_mib": {h.buffer: str(h.mib) for h in b.kv},
            "weights_gpu_mib": str(b.weights_gpu_mib),
            "weights_host_mib": str(b.weights_host_mib),
            "kv_gpu_mib": str(b.kv_gpu_mib),
            "kv_host_mib": str(b.kv_host_mib),
            "processor": b.processor,
            "offloaded_layers": list(b.offloaded_layers) if b.offloaded_layers else None,
        } for b in verdict.blocks],
        "checks": [{"role": c.role.value, "outcome": c.outcome.value, "message": c.message}
                   for c in verdict.checks],
        "warnings": list(verdict.warnings),
    }
