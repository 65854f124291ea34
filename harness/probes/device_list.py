"""Reads a ``--device-config`` file into the devices a launch spreads a model over.

The file (``harness/resources/schemas/device-list.schema.json``) lists devices in llama.cpp's
device order: a card by its config name (memory, bandwidth and headroom from
``configs/gpu/<card>.json``, any of them overridable), or an RPC endpoint with the memory it
may hold and the bandwidth it reads at. ``rpc_device_list`` makes the same list for RPC
servers the harness started itself (the multi-device suite), ``card_device_list`` the list
of a runner's own cards as the build under test lists them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.data_schema import load_json, schema_file
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.device_list import Device, DeviceKind, DeviceList
from harness.facts.gpu import GpuConfig
from harness.planning.autotune import match_config
from harness.probes.devices import Device as ListedDevice

DEVICE_LIST_SCHEMA = schema_file("device-list")
_FIX = ("write the devices as configs/gpu/devices/README.md shows: a card's config name, "
        "or an RPC endpoint with memory_mib and bandwidth_gbps")


def load_device_list(path: Path, cards: Sequence[GpuConfig]) -> DeviceList:
    """The devices in ``path``; ConfigError names the file, each problem and the fix."""
    data = load_json(path, DEVICE_LIST_SCHEMA, ConfigError, fix=_FIX)
    by_name = {card.name: card for card in cards}
    devices = []
    for index, entry in enumerate(data["devices"]):
        devices.append(_device(entry, by_name, f"{path}: $.devices[{index}]"))
    first_card = next((i for i, d in enumerate(devices) if d.kind is DeviceKind.CARD),
                      len(devices))
    if any(d.kind is DeviceKind.RPC for d in devices[first_card:]):
        # src/llama.cpp puts every RPC device before the build's own GPUs, and
        # --tensor-split's shares follow that order, not the file's.
        raise ConfigError(f"{path}: an RPC endpoint follows a card, but llama.cpp orders RPC "
                          "devices before the build's own GPUs: list the RPC endpoints first")
    keys = [d.key for d in devices]
    if repeated := sorted({k for k in keys if keys.count(k) > 1} - set(by_name)):
        # Two cards of one model are two devices; one endpoint twice is one server.
        raise ConfigError(f"{path}: the RPC endpoint {', '.join(repeated)} is listed twice; "
                          "each RPC server is one device: list it once")
    return DeviceList(tuple(devices), str(path))


def _device(entry: Mapping[str, Any], cards: Mapping[str, GpuConfig], where: str) -> Device:
    if "rpc" in entry:
        if not 0 < int(entry["rpc"].rsplit(":", 1)[1]) < 65536:
            raise ConfigError(f"{where}.rpc: {entry['rpc']!r} has no valid port; give the "
                              "port the RPC server listens on (1-65535)")
        return Device(kind=DeviceKind.RPC, name=entry["rpc"], endpoint=entry["rpc"],
                      memory_mib=int(entry["memory_mib"]),
                      reserved_mib=int(entry.get("reserved_mib", 0)),
                      bandwidth_gbps=float(entry["bandwidth_gbps"]),
                      hop_latency_us=float(entry.get("hop_latency_us", 0.0)))
    card = cards.get(entry["card"])
    if card is None:
        raise ConfigError(f"{where}: no card config is named {entry['card']!r}; known: "
                          f"{', '.join(sorted(cards)) or 'none'} (configs/gpu/<name>.json)")
    memory = int(entry.get("memory_mib", card.vram_mib))
    if memory > card.vram_mib:
        raise ConfigError(f"{where}: memory_mib {memory} is more than {card.name}'s "
                          f"{card.vram_mib} MiB; give at most the card's memory")
    return Device(kind=DeviceKind.CARD, name=card.name, memory_mib=memory,
                  reserved_mib=card.reserved_headroom_mib,
                  bandwidth_gbps=float(entry.get("bandwidth_gbps",
                                                 card.memory_bandwidth_gbps)))


def rpc_device_list(endpoints: Sequence[str], memory_mib: Sequence[int], *,
                    bandwidth_gbps: float, hop_latency_us: float = 0.0) -> DeviceList:
    """RPC devices at ``endpoints``, each with its memory, read at one bandwidth."""
    if len(endpoints) != len(memory_mib):
        raise ValueError("one memory figure per endpoint")
    return DeviceList(tuple(
        Device(kind=DeviceKind.RPC, name=endpoint, endpoint=endpoint, memory_mib=memory,
               reserved_mib=0, bandwidth_gbps=bandwidth_gbps, hop_latency_us=hop_latency_us)
        for endpoint, memory in zip(endpoints, memory_mib, strict=True)),
        "RPC servers started by the harness")


def card_device_list(listed: Sequence[ListedDevice], backend: Backend,
                     cards: Sequence[GpuConfig]) -> DeviceList:
    """The build's own ``backend`` devices in its order, each as a card: the memory it lists
    free now (other processes' use is not the plan's), the headroom and bandwidth of the
    card config its name matches. ConfigError names a device no config matches."""
    devices = []
    for seen in (d for d in listed if d.backend is backend):
        card = match_config(seen.description, cards)
        if card is None:
            raise ConfigError(f"{seen.name} ({seen.description}) matches no card config: add "
                              "configs/gpu/<card>.json with a `match` pattern for its name")
        devices.append(Device(kind=DeviceKind.CARD, name=seen.name, memory_mib=seen.free_mib,
                              reserved_mib=card.reserved_headroom_mib,
                              bandwidth_gbps=card.memory_bandwidth_gbps,
                              listed_name=seen.name))
    return DeviceList(tuple(devices), f"the {backend.value} devices the build lists")
