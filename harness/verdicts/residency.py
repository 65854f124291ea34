"""How much of each model really sits on the GPU, and whether that is what the plan asked for.

Pure: log text and planning values in, frozen dataclasses out. The figure is the one
``ollama ps`` shows as "48%/52% CPU/GPU", but read from the server's own lines, per model
block (target, drafter; the blocks are cut by ``launch_log.split_blocks``):

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

``planned_gpu_share`` says where llama.cpp puts each tensor for a launch's offload flags
(``-ngl``, ``--n-cpu-moe``, ``--cpu-moe``, ``--n-cpu-ffn``), following ``load_tensors``: the
input layer (``token_embd`` and the other ``LLM_TENSOR_LAYER_INPUT`` tensors) always stays
on the CPU device; ``-ngl N`` puts the *last* N of the ``n_layer + 1`` layers (the
repeating blocks, then the output layer) on the GPU (``i_gpu_start = n_layer + 1 - N``);
the override flags then send the expert / dense-FFN tensors of the blocks they name to the
CPU buffer type (common/common.h ``llm_add_n_cpu_ffn_overrides``,
``llm_ffn_exps_cpu_override``). A model without ``output.weight`` uses ``token_embd`` as
its output matrix too, loaded a second time onto the output layer's device
(src/llama-model-loader.cpp ``create_tensor``, ``TENSOR_DUPLICATED``).

``residency_verdict`` compares the two: device bytes against the planned device bytes
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
from typing import Protocol

import gguf

from harness.facts.model import ModelFacts
from harness.verdicts.gpu_use import gpu_backend_of
from harness.verdicts.launch_log import (
    BlockKind,
    BlockReport,
    BlockRole,
    BufferSize,
    parse_block,
    split_blocks,
)

MIB = 1024 * 1024


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
    """The residency of one parsed block (``launch_log.parse_block``)."""
    return BlockResidency(block.role, block.kind, _holdings(block.model_buffers),
                          _holdings(block.kv_buffers), block.offloaded_layers)


def residency(log: str) -> tuple[BlockResidency, ...]:
    """Every block's residency, target first; () when the log has no model block."""
    return tuple(block_residency(parse_block(block)) for block in split_blocks(log))


# --- what the plan asks for ------------------------------------------------------------------


class OffloadRequest(Protocol):
    """The launch fields that decide tensor placement (``LaunchSpec`` has them all)."""

    @property
    def n_gpu_layers(self) -> int | None: ...

    @property
    def n_cpu_moe(self) -> int | None: ...

    @property
    def cpu_moe(self) -> bool: ...

    @property
    def n_cpu_ffn(self) -> int | None: ...


@dataclass(frozen=True)
class NonLayerBytes:
    """The bytes outside the repeating blocks, split the way ``load_tensors`` places them.

    ``ModelFacts.non_layer_bytes`` is their sum; placing them needs the tensor names.
    """

    #: ``LLM_TENSOR_LAYER_INPUT`` tensors (src/llama-arch.cpp): on the CPU device always.
    input: int
    #: Everything else outside the blocks (``output``, ``output_norm``, …): the output
    #: layer's device.
    output: int
    #: ``token_embd`` loaded again as the output matrix (no ``output.weight``), else 0.
    duplicated: int


#: The input layer's tensors (src/llama-arch.cpp, ``LLM_TENSOR_LAYER_INPUT``), by gguf name.
_INPUT_TENSORS = frozenset(str(gguf.TENSOR_NAMES[t]) + ".weight" for t in (
    gguf.MODEL_TENSOR.TOKEN_EMBD, gguf.MODEL_TENSOR.POS_EMBD, gguf.MODEL_TENSOR.TOKEN_TYPES,
    gguf.MODEL_TENSOR.PER_LAYER_TOKEN_EMBD))
_TOKEN_EMBD = str(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.TOKEN_EMBD]) + ".weight"
_OUTPUT = str(gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.OUTPUT]) + ".weight"
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")


def non_layer_bytes(tensors: Iterable[tuple[str, int]], block_count: int) -> NonLayerBytes:
    """Split a GGUF's tensors outside ``blk.0`` … ``blk.{block_count-1}`` into input and output.

    ``tensors`` are (name, bytes) pairs, e.g. from ``gguf.GGUFReader(path).tensors``.
    """
    inputs = output = embd = 0
    has_output = False
    for name, size in tensors:
        block = _BLOCK_TENSOR.match(name)
        if block is not None and int(block[1]) < block_count:
            continue
        if name in _INPUT_TENSORS:
            inputs += size
            embd += size if name == _TOKEN_EMBD else 0
        else:
            output += size
            has_output = has_output or name == _OUTPUT
    return NonLayerBytes(inputs, output, 0 if has_output else embd)


@dataclass(frozen=True)
class PlannedShare:
    """Where a launch's offload flags put a model's weights, in bytes."""

    #: Bytes llama.cpp places on the GPU / in host memory for this launch.
    gpu_bytes: int
    host_bytes: int
    #: Non-layer bytes whose side is not known because the input/output split was not
    #: given; the GPU holds between ``gpu_bytes`` and ``gpu_bytes + unplaced_bytes``.
    unplaced_bytes: int
    #: Of ``host_bytes``: the expert / dense-FFN tensors the override flags keep on the CPU
    #: in blocks that are otherwise on the GPU.
    override_host_bytes: int
    #: Layers (of ``n_layer + 1``: blocks and the output layer) on the GPU.
    gpu_layers: int
    total_layers: int
    #: How the layer count was decided, for messages.
    basis: str

    @property
    def total_bytes(self) -> int:
        return self.gpu_bytes + self.host_bytes + self.unplaced_bytes

    @property
    def gpu_share_range(self) -> tuple[float, float]:
        """The GPU's share of the weights: lowest and highest (equal when all is placed).

        Sound for both cases of an unknown split: a tied output adds ``token_embd`` to
        both the GPU side and the total, which keeps the share inside this range.
        """
        total = self.total_bytes
        if total <= 0:
            return 0.0, 0.0
        return self.gpu_bytes / total, (self.gpu_bytes + self.unplaced_bytes) / total

    def describe(self) -> str:
        low, high = self.gpu_share_range
        share = f"{low:.0%}" if low == high else f"{low:.0%} to {high:.0%}"
        gpu = _mib(self.gpu_bytes)
        if self.unplaced_bytes:
            gpu += f" to {_mib(self.gpu_bytes + self.unplaced_bytes)}"
        return (f"{share} GPU ({gpu} of {_mib(self.total_bytes)}, "
                f"{self.gpu_layers}/{self.total_layers} layers, {self.basis})")


@dataclass(frozen=True)
class Offload:
    """An ``OffloadRequest`` by value: for a drafter (``--spec-draft-ngl``) or a test."""

    n_gpu_layers: int | None = None
    n_cpu_moe: int | None = None
    cpu_moe: bool = False
    n_cpu_ffn: int | None = None


def planned_gpu_share(model: ModelFacts, spec: OffloadRequest,
                      non_layer: NonLayerBytes | None = None, *, gpu_device: bool = True,
                      engine_layers: int | None = None) -> PlannedShare:
    """Where ``spec``'s flags put ``model``'s weights (``load_tensors``; module docstring).

    ``spec``: a ``LaunchSpec`` (``plan.spec``) or an ``Offload``; the override flags
    match tensor names by common/common.h LLM_FFN_EXPS_REGEX / LLM_FFN_DENSE_REGEX,
    the classes ``LayerBytes`` holds (probes/gguf_facts.py). ``non_layer``: the
    input/output split of the non-layer bytes (``non_layer_bytes``); without it they
    count as unplaced.
    ``gpu_device`` False: the build registers no GPU (a CPU build; ``act_gpu_layers`` is 0
    without devices), so everything is host. ``engine_layers``: the N of the log's
    ``offloaded N/M`` line, used when ``spec`` leaves ``-ngl`` to the server (unset or
    ``auto``: ``--fit`` picks it); without it such a spec counts as every layer, what
    llama.cpp does with ``-1`` when nothing fits it. Raises ValueError when
    ``model.layer_bytes`` is not one entry per block.
    """
    layers = sorted(model.layer_bytes, key=lambda layer: layer.index)
    n_layer = model.block_count
    if [layer.index for layer in layers] != list(range(n_layer)):
        raise ValueError(f"{model.path}: planned_gpu_share needs layer_bytes for blocks "
                         f"0..{n_layer - 1}, got {[layer.index for layer in layers]}")
    total_layers = n_layer + 1
    ngl, basis = _gpu_layers(spec.n_gpu_layers, engine_layers, total_layers, gpu_device)
    i_gpu_start = total_layers - ngl
    moe_blocks = n_layer if spec.cpu_moe else max(0, spec.n_cpu_moe or 0)
    ffn_blocks = max(0, spec.n_cpu_ffn or 0)
    gpu = host = overridden = 0
    for layer in layers:
        if layer.index < i_gpu_start:
            host += layer.total
            continue
        # The overrides match tensor names whatever device the block has; they only move
        # bytes when the block would otherwise be on the GPU. LLM_FFN_DENSE_REGEX matches
        # ffn_gate/up/down only, while LayerBytes.dense_ffn also holds shared experts
        # (ffn_*_shexp): the planner uses --n-cpu-ffn for dense models only, which have none.
        kept = (layer.expert if layer.index < moe_blocks else 0) + (
            layer.dense_ffn if layer.index < ffn_blocks else 0)
        overridden += kept
        host += kept
        gpu += layer.total - kept
    output_on_gpu = ngl > 0
    unplaced = 0
    if non_layer is None:
        if output_on_gpu:
            unplaced = model.non_layer_bytes
        else:
            host += model.non_layer_bytes
    else:
        host += non_layer.input
        if output_on_gpu:
            gpu += non_layer.output + non_layer.duplicated
        else:
            # On the host the duplicate maps the same file bytes as the input (mmap).
            host += non_layer.output
    return PlannedShare(gpu, host, unplaced, overridden, ngl, total_layers, basis)


def _gpu_layers(n_gpu_layers: int | None, engine_layers: int | None, total_layers: int,
                gpu_device: bool) -> tuple[int, str]:
    if not gpu_device:
        return 0, "no GPU device: everything on the CPU"
    if n_gpu_layers is not None and n_gpu_layers >= 0:
        # load_tensors clamps -ngl to n_layer + 1 (act_gpu_layers).
        return min(n_gpu_layers, total_layers), f"-ngl {n_gpu_layers}"
    # common/common.h: -1 is auto (--fit decides), <= -2 is all.
    if n_gpu_layers is not None and n_gpu_layers <= -2:
        return total_layers, "-ngl all"
    if engine_layers is not None:
        return min(engine_layers, total_layers), "-ngl left to the server, as its log says"
    return total_layers, "-ngl left to the server, taken as all"


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


def _mib(size: int) -> str:
    return f"{size / MIB:.2f} MiB"
