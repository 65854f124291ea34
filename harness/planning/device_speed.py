"""Predicted decode speed of a model spread over several devices (pure).

Reference 004 is described in docs/references.md.

Reference 004's ``predictTps`` sums, over the devices, the bytes a token reads on each
divided by that device's bandwidth: with ``--split-mode layer`` the devices take turns, one
run of blocks after another, so their times add. The bytes are those of
``harness.planning.decode_speed`` (each block's attention, dense FFN and the used share of
its experts, the output matrix on the last device, the K/V cache up to the depth split
like the blocks), the host's part (blocks left on the host, FFN kept there) at the host
bandwidth. Beyond the reference, a device reached over the network (an RPC server) adds
its ``hop_latency_us`` once per token: the activations cross to it and back.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from harness.facts.model_facts import ModelFacts
from harness.planning.decode_speed import (
    GPU_EFFICIENCY,
    HOST_EFFICIENCY,
    block_reads,
    expert_share,
    kv_bytes_read,
)
from harness.planning.kv import KvPlan
from harness.planning.multi_device import DevicePlan
from harness.planning.planned_share import place_layers

MIB = 1024 * 1024


@dataclass(frozen=True)
class DeviceTime:
    """One device's part of a token."""

    device: str
    bytes_per_token: int
    bandwidth_gbps: float
    seconds: float


@dataclass(frozen=True)
class SpreadPrediction:
    tokens_per_s: float
    depth: int
    devices: tuple[DeviceTime, ...]
    host_bytes_per_token: int
    host_gbps: float
    host_seconds: float

    def describe(self) -> str:
        parts = [f"{d.device} {d.bytes_per_token / MIB:.1f} MiB at {d.bandwidth_gbps:g} GB/s "
                 f"x {GPU_EFFICIENCY:g} = {d.seconds * 1e3:.3f} ms" for d in self.devices]
        if self.host_bytes_per_token:
            parts.append(f"host {self.host_bytes_per_token / MIB:.1f} MiB at "
                         f"{self.host_gbps:.1f} GB/s x {HOST_EFFICIENCY:g}")
        return (f"{self.tokens_per_s:.1f} tokens/s at depth {self.depth} over "
                f"{len(self.devices)} devices: " + "; ".join(parts))

    def to_json(self) -> dict[str, Any]:
        return {"tokens_per_s": round(self.tokens_per_s, 3), "depth": self.depth,
                "devices": [{"device": d.device, "bytes_per_token": d.bytes_per_token,
                             "bandwidth_gbps": d.bandwidth_gbps,
                             "seconds": round(d.seconds, 9)} for d in self.devices],
                "host_bytes_per_token": self.host_bytes_per_token,
                "host_gbps": self.host_gbps}


def predict_spread(model: ModelFacts, plan: DevicePlan, kv: KvPlan | None, *,
                   host_gbps: float, depth: int, kv_offload: bool = True) -> SpreadPrediction:
    """The decode speed of ``model`` spread as ``plan`` says, at ``depth`` tokens.
    Raises ValueError for a model without per-block bytes."""
    share = expert_share(model)
    placed = {p.layer.index: p for p in place_layers(model, plan.offload).layers}
    kv_per_block = kv_bytes_read(kv, depth) / model.block_count if model.block_count else 0.0
    kv_device = kv_per_block if kv_offload else 0.0
    owner = {block: k for k, s in enumerate(plan.shares) for block in s.blocks}
    reads = [0.0] * len(plan.shares)
    host = 0.0 if any(s.holds_output for s in plan.shares) else float(model.output_bytes)
    for index, placement in placed.items():
        on_device, on_host = block_reads(placement, share)
        if index in owner:
            reads[owner[index]] += on_device + kv_device
            host += on_host + kv_per_block - kv_device
        else:
            host += on_device + on_host + kv_per_block
    times = []
    for device_share, blocks_read in zip(plan.shares, reads, strict=True):
        read = blocks_read + (model.output_bytes if device_share.holds_output else 0)
        device = device_share.device
        seconds = read / (device.bandwidth_gbps * 1e9 * GPU_EFFICIENCY)
        if device_share.units:
            seconds += device.hop_latency_us / 1e6
        times.append(DeviceTime(device.key, round(read), device.bandwidth_gbps, seconds))
    host_seconds = host / (host_gbps * 1e9 * HOST_EFFICIENCY) if host_gbps > 0 else 0.0
    total = sum(t.seconds for t in times) + host_seconds
    return SpreadPrediction(1 / total if total > 0 else 0.0, depth, tuple(times), round(host),
                            host_gbps, host_seconds)
