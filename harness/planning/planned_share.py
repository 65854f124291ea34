"""Where a launch's offload flags put a model's weights, in bytes (pure).

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

``residency`` holds what the log shows against this share.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import gguf

from harness.facts.model_facts import LayerBytes, ModelFacts

MIB = 1024 * 1024


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


@dataclass(frozen=True)
class LayerPlacement:
    """Where one block's tensors sit for a launch: the block's device, and the FFN parts
    an override flag keeps in host memory although the block is on the GPU."""

    layer: LayerBytes
    on_gpu: bool
    expert_on_host: bool = False
    dense_ffn_on_host: bool = False

    @property
    def host_kept(self) -> int:
        """Bytes of this GPU block the overrides keep on the host (0 off the GPU)."""
        return (self.layer.expert if self.expert_on_host else 0) + (
            self.layer.dense_ffn if self.dense_ffn_on_host else 0)


@dataclass(frozen=True)
class Placement:
    """Every block's placement, and the layer count it follows from."""

    layers: tuple[LayerPlacement, ...]
    #: Layers (of ``n_layer + 1``: blocks and the output layer) on the GPU.
    gpu_layers: int
    total_layers: int
    basis: str

    @property
    def output_on_gpu(self) -> bool:
        """The output layer is the last of the ``n_layer + 1``: on the GPU from -ngl 1."""
        return self.gpu_layers > 0


def place_layers(model: ModelFacts, spec: OffloadRequest, *, gpu_device: bool = True,
                 engine_layers: int | None = None) -> Placement:
    """Where ``spec``'s flags put each of ``model``'s blocks (``load_tensors``; the module
    docstring); ``gpu_device`` and ``engine_layers`` as :func:`planned_gpu_share` says.
    Raises ValueError when ``model.layer_bytes`` is not one entry per block."""
    layers = sorted(model.layer_bytes, key=lambda layer: layer.index)
    n_layer = model.block_count
    if [layer.index for layer in layers] != list(range(n_layer)):
        raise ValueError(f"{model.path}: placing the layers needs layer_bytes for blocks "
                         f"0..{n_layer - 1}, got {[layer.index for layer in layers]}")
    total_layers = n_layer + 1
    ngl, basis = _gpu_layers(spec.n_gpu_layers, engine_layers, total_layers, gpu_device)
    i_gpu_start = total_layers - ngl
    moe_blocks = n_layer if spec.cpu_moe else max(0, spec.n_cpu_moe or 0)
    ffn_blocks = max(0, spec.n_cpu_ffn or 0)
    placed = []
    for layer in layers:
        on_gpu = layer.index >= i_gpu_start
        # The overrides match tensor names whatever device the block has; they only move
        # bytes when the block would otherwise be on the GPU. LLM_FFN_DENSE_REGEX matches
        # ffn_gate/up/down only, while LayerBytes.dense_ffn also holds shared experts
        # (ffn_*_shexp): the planner uses --n-cpu-ffn for dense models only, which have none.
        placed.append(LayerPlacement(layer, on_gpu,
                                     expert_on_host=on_gpu and layer.index < moe_blocks,
                                     dense_ffn_on_host=on_gpu and layer.index < ffn_blocks))
    return Placement(tuple(placed), ngl, total_layers, basis)


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
    placement = place_layers(model, spec, gpu_device=gpu_device, engine_layers=engine_layers)
    gpu = host = overridden = 0
    for placed in placement.layers:
        if not placed.on_gpu:
            host += placed.layer.total
            continue
        kept = placed.host_kept
        overridden += kept
        host += kept
        gpu += placed.layer.total - kept
    unplaced = 0
    if non_layer is None:
        if placement.output_on_gpu:
            unplaced = model.non_layer_bytes
        else:
            host += model.non_layer_bytes
    else:
        host += non_layer.input
        if placement.output_on_gpu:
            gpu += non_layer.output + non_layer.duplicated
        else:
            # On the host the duplicate maps the same file bytes as the input (mmap).
            host += non_layer.output
    return PlannedShare(gpu, host, unplaced, overridden, placement.gpu_layers,
                        placement.total_layers, placement.basis)


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


def _mib(size: int) -> str:
    return f"{size / MIB:.2f} MiB"
