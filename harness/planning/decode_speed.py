"""Predicted decode tokens/s from memory bandwidth (reference 004's model), pure.

Reference 004 is described in docs/references.md.

Decoding one token reads every weight it uses once, plus the K/V cache up to the current
depth, so a token takes (bytes read ÷ bandwidth) on each device, and the devices take
turns. Per token:

- each block's attention and norms (``other``) and dense FFN in full, and of its routed
  experts the share a token uses (``expert_used_count / expert_count``), on the device
  ``load_tensors`` gives them (planning/planned_share.py ``place_layers``: ``-ngl``,
  ``--n-cpu-moe``, ``--n-cpu-ffn``);
- the output matrix in full (``ModelFacts.output_bytes``) on the output layer's device;
  the input embedding is one row, so nothing;
- of every K/V cache, the cells up to the depth (``min(depth, cells)`` of one stream: a
  sliding-window cache stops at its window), split over devices like the blocks when the
  KV is offloaded (``--kv-offload``, the default), all in host memory without; a recurrent
  state is read whole.

Bytes on a GPU go at the card's ``memory_bandwidth_gbps`` x :data:`GPU_EFFICIENCY`, bytes in
host memory at the measured host bandwidth x :data:`HOST_EFFICIENCY`. The model holds for
weights much larger than the CPU's last-level cache; for smaller ones the prediction
says so (``caveat``): part of them is read from the cache and per-token overheads weigh,
so the measured speed can be well off either way.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from harness.facts.gpu import GpuInfo
from harness.facts.model_facts import ModelFacts
from harness.planning.autotune import TuneSource
from harness.planning.kv import KvPlan
from harness.planning.launch_plan import LaunchPlan
from harness.planning.planned_share import LayerPlacement, OffloadRequest, place_layers

#: The share of a GPU's theoretical bandwidth llama.cpp reaches in decode (reference 004).
GPU_EFFICIENCY = 0.7
#: The share of the measured host bandwidth the CPU part reaches (reference 004).
HOST_EFFICIENCY = 0.6
#: Host bytes per token below this many last-level caches make the prediction a caveat.
LLC_MULTIPLE = 4
#: The depths ``harness plan`` predicts at: a short prompt, and 60 % of the context.
SHORT_DEPTH = 512
DEEP_SHARE = 0.6


@dataclass(frozen=True)
class Bandwidths:
    """What each side reads at, and where the figure came from (for messages)."""

    host_gbps: float
    host_source: str
    #: None: no GPU in the plan.
    gpu_gbps: float | None = None
    gpu_source: str = ""
    #: The host's last-level cache in bytes (0: unknown), for the caveat.
    last_level_cache_bytes: int = 0


@dataclass(frozen=True)
class DecodePrediction:
    tokens_per_s: float
    depth: int
    gpu_bytes_per_token: int
    host_bytes_per_token: int
    gpu_seconds: float
    host_seconds: float
    bandwidths: Bandwidths
    #: Why the figure should not be trusted here; None when the model holds.
    caveat: str | None

    def describe(self) -> str:
        mib = 1024 * 1024
        parts = [f"{self.tokens_per_s:.1f} tokens/s at depth {self.depth}: "
                 f"{self.host_bytes_per_token / mib:.1f} MiB/token from host memory "
                 f"({self.bandwidths.host_gbps:.1f} GB/s x {HOST_EFFICIENCY:g}, "
                 f"{self.bandwidths.host_source})"]
        if self.bandwidths.gpu_gbps is not None:
            parts.append(f"{self.gpu_bytes_per_token / mib:.1f} MiB/token from the GPU "
                         f"({self.bandwidths.gpu_gbps:g} GB/s x {GPU_EFFICIENCY:g}, "
                         f"{self.bandwidths.gpu_source})")
        text = ", ".join(parts)
        return f"{text}; {self.caveat}" if self.caveat else text

    def to_json(self) -> dict[str, Any]:
        return {"tokens_per_s": round(self.tokens_per_s, 3), "depth": self.depth,
                "gpu_bytes_per_token": self.gpu_bytes_per_token,
                "host_bytes_per_token": self.host_bytes_per_token,
                "host_gbps": self.bandwidths.host_gbps,
                "host_source": self.bandwidths.host_source,
                "gpu_gbps": self.bandwidths.gpu_gbps,
                "gpu_source": self.bandwidths.gpu_source or None,
                "caveat": self.caveat}


def predict_decode(model: ModelFacts, spec: OffloadRequest, kv: KvPlan | None,
                   bandwidths: Bandwidths, *, depth: int,
                   kv_offload: bool = True, kv_read_cost: float = 1.0) -> DecodePrediction:
    """The decode speed of ``model`` under ``spec``'s placement at ``depth`` tokens.

    ``kv_read_cost``: the cache's bytes count this many times (a quantised cache that is
    slow to dequantise, harness/tune/quality.py); 1 for the plain bytes.

    ``bandwidths.gpu_gbps`` None means no GPU device: everything is read from host memory.
    Raises ValueError for a model without per-block bytes (not read from a GGUF file).
    """
    gpu_device = bandwidths.gpu_gbps is not None
    placement = place_layers(model, spec, gpu_device=gpu_device)
    share = expert_share(model)
    gpu = host = 0.0
    for placed in placement.layers:
        on_device, on_host = block_reads(placed, share)
        gpu += on_device
        host += on_host
    if placement.output_on_gpu:
        gpu += model.output_bytes
    else:
        host += model.output_bytes
    kv_read = kv_bytes_read(kv, depth) * kv_read_cost
    gpu_blocks = sum(1 for placed in placement.layers if placed.on_gpu)
    kv_gpu_share = gpu_blocks / model.block_count if kv_offload and model.block_count else 0.0
    gpu += kv_read * kv_gpu_share
    host += kv_read * (1 - kv_gpu_share)
    gpu_seconds = (gpu / (bandwidths.gpu_gbps * 1e9 * GPU_EFFICIENCY)
                   if bandwidths.gpu_gbps else 0.0)
    host_seconds = host / (bandwidths.host_gbps * 1e9 * HOST_EFFICIENCY)
    seconds = gpu_seconds + host_seconds
    return DecodePrediction(
        tokens_per_s=1 / seconds if seconds > 0 else 0.0, depth=depth,
        gpu_bytes_per_token=round(gpu), host_bytes_per_token=round(host),
        gpu_seconds=gpu_seconds, host_seconds=host_seconds, bandwidths=bandwidths,
        caveat=_caveat(round(host), bandwidths.last_level_cache_bytes))


def expert_share(model: ModelFacts) -> float:
    """The share of a block's routed experts one token reads (1 for a dense model)."""
    return (model.expert_used_count / model.expert_count
            if model.expert_count and model.expert_used_count else 1.0)


def block_reads(placed: LayerPlacement, share: float) -> tuple[float, float]:
    """Bytes one token reads of a block: on its device, and in host memory (the whole
    block off the GPU; the FFN parts an override keeps there)."""
    layer = placed.layer
    expert, dense = layer.expert * share, float(layer.dense_ffn)
    read = layer.other + expert + dense
    if not placed.on_gpu:
        return 0.0, read
    kept = (expert if placed.expert_on_host else 0.0) + (
        dense if placed.dense_ffn_on_host else 0.0)
    return read - kept, kept


def prediction_depths(context: int) -> tuple[int, ...]:
    """The depths a plan is predicted at: :data:`SHORT_DEPTH` and 60 % of the context."""
    deep = int(context * DEEP_SHARE)
    return (SHORT_DEPTH, deep) if deep > SHORT_DEPTH else (min(SHORT_DEPTH, context),)


def kv_bytes_read(kv: KvPlan | None, depth: int) -> float:
    """The K/V bytes one token reads at ``depth`` (every cache up to its own cells)."""
    if kv is None or not kv.valid:
        return 0.0
    read = 0.0
    for cache in kv.caches:
        if cache.all_cells <= 0:
            continue
        per_cell = cache.total_bytes / cache.all_cells
        read += per_cell * min(depth, cache.cells)
    return read + kv.recurrent_bytes / max(1, kv.n_seq_max)


def _caveat(host_bytes: int, llc: int) -> str | None:
    if host_bytes <= 0 or llc <= 0 or host_bytes >= LLC_MULTIPLE * llc:
        return None
    return (f"only {host_bytes / 2**20:.1f} MiB per token comes from host memory, under "
            f"{LLC_MULTIPLE}x the {llc / 2**20:.0f} MiB last-level cache: part of it is read "
            "from the cache and per-token overheads weigh, so the bandwidth model does not "
            "hold here (bench, 37 MiB, measured 0.74x its prediction)")


@dataclass(frozen=True)
class HostBandwidth:
    """The host side of :class:`Bandwidths`, as the probe measured it."""

    read_gbps: float
    source: str
    last_level_cache_bytes: int = 0

    def bandwidths(self) -> Bandwidths:
        """Host memory only: the plan has no GPU (add one with ``dataclasses.replace``)."""
        return Bandwidths(host_gbps=self.read_gbps, host_source=self.source,
                          last_level_cache_bytes=self.last_level_cache_bytes)


def plan_bandwidths(plan: LaunchPlan, gpu: GpuInfo | None,
                    host: HostBandwidth) -> Bandwidths | str:
    """The bandwidths ``plan`` reads at, or why the GPU's is not known.

    The GPU's is its config's ``memory_bandwidth_gbps``: the matched card's, or the card
    the VRAM bucket borrowed settings from (said in the source, as it is another card).
    """
    base = host.bandwidths()
    if gpu is None:
        return base
    config = plan.tune.config
    if config is None:
        return (f"no GPU config gives {gpu.name}'s memory bandwidth; add one "
                "(configs/gpu/README.md)")
    how = ("its config" if plan.tune.source is TuneSource.MATCH
           else f"borrowed from {config.name} by the VRAM bucket")
    return replace(base, gpu_gbps=config.memory_bandwidth_gbps,
                   gpu_source=f"{config.name}, {how}")


def predict_plan(plan: LaunchPlan, model: ModelFacts, bandwidths: Bandwidths, *,
                 kv_read_cost: float = 1.0) -> tuple[DecodePrediction, ...]:
    """``plan``'s decode speed at :func:`prediction_depths` of its per-slot context."""
    context = (plan.kv.n_ctx_seq if plan.kv is not None and plan.kv.valid
               else plan.spec.ctx_size or model.context_length)
    return tuple(predict_decode(model, plan.spec, plan.kv, bandwidths, depth=depth,
                                kv_offload=plan.spec.kv_offload is not False)
                 for depth in prediction_depths(context))
