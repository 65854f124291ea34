"""The devices a launch may spread a model over, in priority order (plain values).

A device is either a GPU card (its memory, bandwidth and headroom from its
``configs/gpu/<card>.json``) or one of llama.cpp's RPC devices: an ``rpc-server`` at
``HOST:PORT`` that ``llama-server --rpc`` uses as one more ggml device, with the memory it
may hold (the cap its process runs under) and the bandwidth it reads weights at. The
order is llama.cpp's device order: with ``--split-mode layer`` the first device holds the
lowest blocks and the last one the highest blocks and the output layer
(src/llama-model.cpp ``load_tensors``).
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

MIB = 1024 * 1024


class DeviceKind(enum.StrEnum):
    """Where a device comes from: a card config, or an RPC endpoint."""

    CARD = "card"
    RPC = "rpc"


#: ``HOST:PORT`` of an RPC server (an IPv4 address or a host name; ggml-rpc parses the last
#: colon as the port's start).
ENDPOINT = re.compile(r"^(?P<host>[A-Za-z0-9.-]{1,253}):(?P<port>\d{1,5})$")


@dataclass(frozen=True)
class Device:
    """One device of a launch's device list."""

    kind: DeviceKind
    #: What the plan and the report call it: the card's config name, or the endpoint.
    name: str
    #: Memory the device has, and what the plan leaves free on it (a card's
    #: ``reserved_headroom_mib``; the runtime's own buffers and other processes).
    memory_mib: int
    reserved_mib: int
    #: What the device reads weights at (a card's ``memory_bandwidth_gbps``).
    bandwidth_gbps: float
    #: An RPC device's ``HOST:PORT``; None for a card.
    endpoint: str | None = None
    #: The time one token's hop to this device costs beyond its reads (an RPC device's
    #: network round trip), in microseconds; 0 for a card on the local bus.
    hop_latency_us: float = 0.0
    #: The name the build lists a card by (``CUDA0``), where the build itself listed it;
    #: None for a card from a config file. (An RPC device's is ``RPC<n>``, n its place
    #: among the list's endpoints: llama.cpp registers ``--rpc`` endpoints in order.)
    listed_name: str | None = None

    @property
    def budget_bytes(self) -> int:
        """What the plan may place on the device."""
        return max(0, self.memory_mib - self.reserved_mib) * MIB

    @property
    def key(self) -> str:
        """How the server's log names the device's buffers: an RPC device by its endpoint
        (every RPC buffer is labelled ``RPC<n>[<endpoint>]``), a card by its name."""
        return self.endpoint or self.name


@dataclass(frozen=True)
class DeviceList:
    """The devices of one ``--device-config`` file, in order."""

    devices: tuple[Device, ...]
    #: Where it was read from; only for messages.
    source: str = ""

    @property
    def rpc_endpoints(self) -> tuple[str, ...]:
        return tuple(d.endpoint for d in self.devices if d.endpoint)

    @property
    def listed_names(self) -> tuple[str, ...] | None:
        """Every device's name as llama-server lists it (``--device``'s words), in order;
        None when a card's is not known (a card from a config file)."""
        names, rpc = [], 0
        for device in self.devices:
            if device.kind is DeviceKind.RPC:
                names.append(f"RPC{rpc}")
                rpc += 1
            elif device.listed_name is not None:
                names.append(device.listed_name)
            else:
                return None
        return tuple(names)
