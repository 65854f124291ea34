"""One model spread over several devices: which layers each holds, and the flags (pure).

References 003 and 004 are described in docs/references.md.

Reference 004's ``placeLayers`` packs layers onto GPUs in priority order and then spreads
them so that every GPU keeps the same fraction of headroom (a greedy packing leaves the
first device full, and llama.cpp then fails to allocate its compute buffer there). This
module does the same in llama.cpp's own order (src/llama-model.cpp ``load_tensors``):

- the *units* are the ``n_layer`` blocks and the output layer; ``-ngl N`` puts the last N
  of them on devices, the rest on the host;
- with ``--split-mode layer`` device ``k`` holds a contiguous run of units, the first device
  the lowest ones and the last device the highest blocks and the output layer;
- unit ``u`` (counted from the first offloaded one, of ``act`` units) goes to the first
  device whose cumulative, normalised ``--tensor-split`` share is above ``u / act``
  (``std::upper_bound`` over the splits). Given as unit counts per device, the split
  therefore says exactly which units each device gets: :func:`assigned_units` is that rule.

A unit costs its weights (less what ``--n-cpu-moe``/``--n-cpu-ffn`` keep on the host) and,
with the KV cache offloaded, its blocks' share of the cache; the output layer costs its
matrix plus one ubatch of logits (``vocab x ubatch`` floats). Every device also holds a
compute buffer, reference 004's 3.5 KiB per context token split over the devices.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.facts.device_list import MIB, Device, DeviceList
from harness.facts.model_facts import ModelFacts
from harness.planning.planned_share import OffloadRequest, place_layers

#: Reference 004's compute-buffer estimate: bytes per context token, over all devices.
COMPUTE_BYTES_PER_CTX_TOKEN = 3.5 * 1024
#: Logits are one float per vocabulary entry for each token of a ubatch.
LOGIT_BYTES = 4
DEFAULT_UBATCH = 512


def assigned_units(tensor_split: Sequence[float], n_layer: int,
                   n_gpu_layers: int) -> tuple[int, ...]:
    """The device of each offloaded unit (blocks ``n_layer + 1 - ngl`` … ``n_layer - 1``,
    then the output layer) under ``--tensor-split`` (llama.cpp's ``load_tensors`` rule)."""
    act = min(max(n_gpu_layers, 0), n_layer + 1)
    total = float(sum(tensor_split))
    if act == 0 or total <= 0:
        return ()
    cumulative, splits = 0.0, []
    for share in tensor_split:
        cumulative += share
        splits.append(cumulative / total)
    last = len(splits) - 1
    return tuple(min(bisect.bisect_right(splits, unit / act), last) for unit in range(act))


@dataclass(frozen=True)
class DeviceShare:
    """What the plan puts on one device."""

    device: Device
    #: The blocks it holds (a contiguous run), empty for none.
    blocks: tuple[int, ...]
    holds_output: bool
    weight_bytes: int
    kv_bytes: int
    compute_bytes: int

    @property
    def units(self) -> int:
        return len(self.blocks) + (1 if self.holds_output else 0)

    @property
    def used_bytes(self) -> int:
        return self.weight_bytes + self.kv_bytes + self.compute_bytes

    @property
    def fits(self) -> bool:
        return self.used_bytes <= self.device.budget_bytes

    def layer_range(self) -> str:
        """``blocks 0-2``, ``blocks 3-5 + output``, ``output only`` or ``nothing``."""
        parts = []
        if self.blocks:
            first, last = self.blocks[0], self.blocks[-1]
            parts.append(f"block {first}" if first == last else f"blocks {first}-{last}")
        if self.holds_output:
            parts.append("output")
        return " + ".join(parts) or "nothing"

    def describe(self) -> str:
        return (f"{self.device.key}: {self.layer_range()}; weights {_mib(self.weight_bytes)}, "
                f"KV {_mib(self.kv_bytes)}, compute {_mib(self.compute_bytes)} = "
                f"{_mib(self.used_bytes)} of {_mib(self.device.budget_bytes)}"
                + ("" if self.fits else " (over its budget)"))


@dataclass(frozen=True)
class DevicePlan:
    """The spread of one model over a device list, and the flags that ask for it."""

    devices: DeviceList
    shares: tuple[DeviceShare, ...]
    #: Units (blocks and the output layer) on devices: ``-ngl``.
    n_gpu_layers: int
    total_units: int
    split_mode: str
    #: ``--main-gpu``: the one device of a single-device plan, else None (layer split).
    main_gpu: int | None
    #: Units per device: ``--tensor-split``.
    tensor_split: tuple[int, ...]
    #: How the units were spread: ``equal headroom``, ``in order`` or ``over budget``.
    spread: str
    reasons: tuple[str, ...]
    #: The layer count and host overrides the spread was made under (for the prediction).
    offload: OffloadRequest
    #: The KV cache bytes, context and ubatch the shares were sized with: a retreat after
    #: an out-of-memory start plans again from the same inputs (:func:`moved_off`).
    kv_bytes: int = 0
    context: int = 0
    ubatch: int = DEFAULT_UBATCH

    @property
    def fits(self) -> bool:
        return all(share.fits for share in self.shares)

    @property
    def tensor_split_arg(self) -> str:
        return ",".join(str(units) for units in self.tensor_split)

    @property
    def rpc_arg(self) -> str | None:
        """``--rpc``'s value: the list's RPC endpoints in order, None for none."""
        return ",".join(self.devices.rpc_endpoints) or None

    @property
    def device_arg(self) -> str | None:
        """``--device``'s value: every device of the list by the name llama-server lists
        it by, so no other device of the build takes part; None when a card's name is not
        known (a card from a config file: the build's own devices are then all used)."""
        names = self.devices.listed_names
        return ",".join(names) if names else None

    def describe_rows(self) -> list[str]:
        return [share.describe() for share in self.shares]

    def to_json(self) -> dict[str, Any]:
        return {"split_mode": self.split_mode, "spread": self.spread,
                "tensor_split": list(self.tensor_split), "fits": self.fits,
                "shares": [{"device": s.device.key, "kind": s.device.kind.value,
                            "blocks": list(s.blocks), "output": s.holds_output,
                            "weight_bytes": s.weight_bytes, "kv_bytes": s.kv_bytes,
                            "compute_bytes": s.compute_bytes,
                            "budget_bytes": s.device.budget_bytes} for s in self.shares]}


@dataclass(frozen=True)
class _Unit:
    block: int | None  # None: the output layer
    cost: int
    weights: int
    kv: int


def plan_devices(model: ModelFacts, devices: DeviceList, offload: OffloadRequest, *,
                 kv_bytes: int, context: int, ubatch: int = DEFAULT_UBATCH) -> DevicePlan:
    """Spread ``model`` over ``devices`` under ``offload``'s ``-ngl`` and host overrides.

    ``kv_bytes``: the whole KV cache on the devices (0: kept on the host, ``--no-kv-offload``);
    it is split over the blocks evenly. ``context``: the tokens the compute buffers are
    sized for. Raises ValueError for a model without per-block bytes or no devices.
    """
    if not devices.devices:
        raise ValueError("a device plan needs at least one device")
    placement = place_layers(model, offload)
    n_layer = model.block_count
    kv_per_block = kv_bytes // n_layer if n_layer else 0
    units = [_Unit(p.layer.index, p.layer.total - p.host_kept + kv_per_block,
                   p.layer.total - p.host_kept, kv_per_block)
             for p in placement.layers if p.on_gpu]
    if placement.output_on_gpu:
        output = model.output_bytes + model.vocab_size * ubatch * LOGIT_BYTES
        units.append(_Unit(None, output, model.output_bytes, 0))
    count = len(devices.devices)
    compute = int(context * COMPUTE_BYTES_PER_CTX_TOKEN / count)
    budgets = [d.budget_bytes - compute for d in devices.devices]
    counts, spread = _spread([u.cost for u in units], budgets)
    owner = assigned_units(counts, n_layer, len(units))
    shares = tuple(_share(device, [u for u, k in zip(units, owner, strict=True) if k == index],
                          compute) for index, device in enumerate(devices.devices))
    one = count == 1
    reasons = (
        ("one device: --split-mode none keeps the model on it (--main-gpu 0)" if one else
         f"{count} devices: --split-mode layer gives each a contiguous run of blocks (the "
         "last one the output layer), so a token crosses each device once; row and tensor "
         "split every matrix and move activations between devices at every layer"),
        f"--tensor-split {','.join(map(str, counts))}: units (blocks + output) per device, "
        f"spread {spread}",
    )
    return DevicePlan(devices, shares, len(units), n_layer + 1,
                      "none" if one else "layer", 0 if one else None, counts, spread, reasons,
                      offload, kv_bytes, context, ubatch)


def step_down(plan: DevicePlan, index: int) -> DeviceList:
    """The device list for the next start after device ``index`` (its position in the list:
    two cards of one model share a name) could not allocate its share: its memory cut to
    what the plan put there less one unit's cost, so that at least one unit moves off it
    (reference 003's one step per out-of-memory start, per device). Raises IndexError for
    a position the plan has no device at."""
    share = plan.shares[index]
    unit = (share.weight_bytes + share.kv_bytes) // max(share.units, 1)
    budget_mib = max(0, (share.used_bytes - max(unit, MIB)) // MIB)
    device = dataclasses.replace(share.device,
                                 memory_mib=share.device.reserved_mib + budget_mib)
    devices = list(plan.devices.devices)
    devices[index] = device
    return dataclasses.replace(plan.devices, devices=tuple(devices))


def moved_off(model: ModelFacts, plan: DevicePlan, index: int) -> DevicePlan | None:
    """The plan for the next start after device ``index`` failed to allocate its share:
    the same inputs over :func:`step_down`'s list. None when nothing can move: the device
    holds no units, or the others cannot take them (the offload ladder's turn then)."""
    if not plan.shares[index].units:
        return None
    following = plan_devices(model, step_down(plan, index), plan.offload,
                             kv_bytes=plan.kv_bytes, context=plan.context, ubatch=plan.ubatch)
    if not following.fits or following.tensor_split == plan.tensor_split:
        return None
    return following


def _spread(costs: Sequence[int], budgets: Sequence[int]) -> tuple[tuple[int, ...], str]:
    """Units per device: every device to the same fraction of its budget when that fits,
    else each filled in order up to its budget (the last one takes the rest)."""
    total_budget = sum(max(b, 0) for b in budgets)
    if total_budget > 0:
        # Each unit goes to the device whose share of the budgets covers the unit's middle.
        bounds, cumulative = [], 0
        for budget in budgets:
            cumulative += max(budget, 0)
            bounds.append(cumulative / total_budget)
        need, running, counts = sum(costs) or 1, 0, [0] * len(budgets)
        for cost in costs:
            middle = (running + cost / 2) / need
            counts[min(bisect.bisect_left(bounds, middle), len(budgets) - 1)] += 1
            running += cost
        if _fits(counts, costs, budgets):
            return tuple(counts), "equal headroom"
    counts, index, used = [0] * len(budgets), 0, 0
    for cost in costs:
        while index < len(budgets) - 1 and used + cost > budgets[index]:
            index, used = index + 1, 0
        counts[index] += 1
        used += cost
    return tuple(counts), "in order" if _fits(counts, costs, budgets) else "over budget"


def _fits(counts: Sequence[int], costs: Sequence[int], budgets: Sequence[int]) -> bool:
    start = 0
    for count, budget in zip(counts, budgets, strict=True):
        if sum(costs[start:start + count]) > budget:
            return False
        start += count
    return True


def _share(device: Device, units: Sequence[_Unit], compute: int) -> DeviceShare:
    return DeviceShare(
        device=device, blocks=tuple(u.block for u in units if u.block is not None),
        holds_output=any(u.block is None for u in units),
        weight_bytes=sum(u.weights for u in units), kv_bytes=sum(u.kv for u in units),
        compute_bytes=compute)


def _mib(size: int) -> str:
    return f"{size / MIB:.2f} MiB"
