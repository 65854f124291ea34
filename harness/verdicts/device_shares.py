"""Each device's share of a spread, from the server's own log, held to the plan (pure).

``harness.planning.multi_device`` plans which blocks, weights and KV cache each device
holds. The server says what it did in the target block:

- ``using device RPC0 (127.0.0.1:50052) …`` / ``using device CUDA0 (NVIDIA …)``: the
  devices, in llama.cpp's order (the device list's order);
- ``<buffer> model buffer size = X MiB``, ``… KV buffer size``, ``… compute buffer size``,
  one per device, an RPC device's buffer labelled ``RPC<n>[<endpoint>]`` (every RPC server's
  buffer type carries its endpoint; the second server's is ``RPC0[…]`` too, so RPC
  buffers are matched by endpoint, a card's by its device name);
- at ``-lv 5``, ``layer N assigned to device NAME`` for every unit (N = ``n_layer``: the
  output layer).

A device the plan gave weights that holds none fails by name, like the single-GPU unused
check. Weights must match the plan within :data:`WEIGHT_TOLERANCE` (the printed MiB are
rounded to 0.01); the KV cache likewise where the plan offloads it. Compute buffers are
reported, not held: the plan's figure is reference 004's rough estimate (reference 004
is described in docs/references.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal

from harness.facts.device_list import MIB
from harness.planning.multi_device import DevicePlan, DeviceShare
from harness.verdicts.block_report import GPU_DEVICE_NAME, BlockReport, BufferSize

#: How far a device's weights or KV may be from the plan: the printed rounding (0.01 MiB)
#: plus per-tensor alignment padding, or 2 % of the planned size.
WEIGHT_TOLERANCE_MIB = Decimal("0.05")
WEIGHT_TOLERANCE_SHARE = Decimal("0.02")


@dataclass(frozen=True)
class ObservedShare:
    """What the log says one device holds."""

    key: str
    #: The name llama.cpp gave it (``RPC1``, ``CUDA0``), from its ``using device`` line.
    device_name: str | None
    model_mib: Decimal
    kv_mib: Decimal
    compute_mib: Decimal
    #: Units (blocks; ``n_layer`` for the output layer) from ``-lv 5``'s assignment lines.
    layers: tuple[int, ...]


@dataclass(frozen=True)
class ShareCheck:
    """One device's share against the plan."""

    planned: DeviceShare
    observed: ObservedShare | None
    problems: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def describe(self) -> str:
        seen = self.observed
        got = ("nothing" if seen is None else
               f"weights {seen.model_mib} MiB, KV {seen.kv_mib} MiB, compute "
               f"{seen.compute_mib} MiB" + (f", units {_ranges(seen.layers)}" if seen.layers
                                            else ""))
        head = (f"{self.planned.device.key}: planned {self.planned.layer_range()} "
                f"({_mib(self.planned.weight_bytes)} weights, {_mib(self.planned.kv_bytes)} KV); "
                f"observed {got}")
        return head + "".join(f"\n    - {problem}" for problem in self.problems)


def device_key(buffer: str) -> str | None:
    """The device key of a buffer name: an RPC buffer's endpoint, a GPU buffer's device name
    (``CUDA0``), None for a host buffer."""
    found = GPU_DEVICE_NAME.match(buffer)
    if found is None:
        return None
    return found["endpoint"] or buffer


def observed_shares(report: BlockReport) -> dict[str, ObservedShare]:
    """Every device's buffers and units in one block, keyed as :func:`device_key` says."""
    # An RPC device's key is the endpoint its ``using device`` line describes.
    names = {d.name: d.description for d in report.devices if d.name.startswith("RPC")}
    totals: dict[str, list[Decimal]] = {}
    for column, buffers in enumerate((report.model_buffers, report.kv_buffers,
                                      report.compute_buffers)):
        for key, mib in _by_device(buffers):
            totals.setdefault(key, [Decimal(0)] * 3)[column] += mib
    layers: dict[str, list[int]] = {}
    for layer, device in report.layer_devices:
        layers.setdefault(names.get(device, device), []).append(layer)
    by_key = {names.get(d.name, d.name): d.name for d in report.devices}
    shares = {}
    for key in {*totals, *layers}:
        model, kv, compute = totals.get(key, [Decimal(0)] * 3)
        shares[key] = ObservedShare(key, by_key.get(key), model, kv, compute,
                                    tuple(sorted(layers.get(key, ()))))
    return shares


def check_device_shares(plan: DevicePlan, report: BlockReport, *, n_layer: int,
                        kv_offloaded: bool = True) -> tuple[ShareCheck, ...]:
    """Each planned device's share against what ``report`` (the target block) shows."""
    seen = observed_shares(report)
    # Cards are the build's GPU devices in order (the device list's order is llama.cpp's).
    gpus = iter(name for name in report.gpu_devices if not name.startswith("RPC"))
    checks = []
    for share in plan.shares:
        key = share.device.endpoint or next(gpus, share.device.key)
        observed = seen.get(key)
        problems = []
        if observed is None or (observed.model_mib == 0 and share.weight_bytes > 0):
            if share.weight_bytes > 0:
                problems.append(f"the plan gave {share.device.key} {share.layer_range()} and "
                                "the server put no weights there: the device was left unused")
        else:
            problems += _size_problem("weights", share.weight_bytes, observed.model_mib)
            if kv_offloaded and share.kv_bytes:
                problems += _size_problem("KV cache", share.kv_bytes, observed.kv_mib)
            planned_units = [*share.blocks, *([n_layer] if share.holds_output else [])]
            if observed.layers and list(observed.layers) != planned_units:
                problems.append(f"units {_ranges(observed.layers)}, planned "
                                f"{_ranges(tuple(planned_units))}")
        checks.append(ShareCheck(share, observed, tuple(problems)))
    return tuple(checks)


def _by_device(buffers: tuple[BufferSize, ...]) -> list[tuple[str, Decimal]]:
    return [(key, buf.mib) for buf in buffers
            if (key := device_key(buf.buffer)) is not None]


def _size_problem(what: str, planned_bytes: int, observed_mib: Decimal) -> list[str]:
    planned = Decimal(planned_bytes) / MIB
    allowed = max(WEIGHT_TOLERANCE_MIB, planned * WEIGHT_TOLERANCE_SHARE)
    if abs(observed_mib - planned) <= allowed:
        return []
    return [f"{what} {observed_mib} MiB, planned {planned:.2f} MiB (allowed ±{allowed:.2f})"]


def _ranges(units: tuple[int, ...]) -> str:
    if not units:
        return "none"
    parts, start, last = [], units[0], units[0]
    for unit in (*units[1:], None):
        if unit is not None and unit == last + 1:
            last = unit
            continue
        parts.append(str(start) if start == last else f"{start}-{last}")
        if unit is not None:
            start = last = unit
    return ",".join(parts)


def _mib(size: int) -> str:
    return f"{size / MIB:.2f} MiB"
