"""Which device of a spread ran out of memory at start, from the server's own words (pure).

A spread's out-of-memory start names the device that could not allocate, in one of the
lines the failure classifier already reads as out of memory (harness/verdicts/failure.py):

- ``failed to allocate RPC0[127.0.0.1:50052] buffer of size N`` (ggml-backend; an RPC
  device's buffer carries its endpoint, and every RPC device's label is ``RPC0[…]``);
- ``failed to allocate CUDA1 buffer of size N`` / ``unable to allocate CUDA1 buffer``
  (ggml-backend, llama-model's ``load_tensors``), the same with ``ROCm1`` or ``Vulkan1``;
- ``allocating 1234.00 MiB on device 1: cudaMalloc failed: out of memory`` (ggml-cuda,
  compiled for HIP too), where the number is the backend's own device index.

The device is found in the plan's list by what names it: an RPC device by its endpoint,
a card by the name the build lists it by (``CUDA1``) where the list has it, else by its
backend index among the list's cards (llama.cpp orders RPC devices first, then the
build's GPUs in their own order).
"""

from __future__ import annotations

import re

from harness.facts.device_list import DeviceKind, DeviceList
from harness.verdicts.block_report import GPU_DEVICE_NAME

_BUFFER = re.compile(r"(?:failed to allocate|unable to allocate) (?P<buffer>\S+) buffer\b")
_CUDA_MALLOC = re.compile(r"allocating [\d.]+ MiB on device (?P<index>\d+): cudaMalloc failed")


def failed_device_index(server_log: str, devices: DeviceList) -> int | None:
    """The position in ``devices`` of the first device the log says could not allocate;
    None when no line names one of them (a host buffer, a device outside the list)."""
    for line in server_log.splitlines():
        index = _named_device(line, devices)
        if index is not None:
            return index
    return None


def _named_device(line: str, devices: DeviceList) -> int | None:
    cards = [i for i, d in enumerate(devices.devices) if d.kind is DeviceKind.CARD]
    found = _BUFFER.search(line)
    if found is not None:
        name = GPU_DEVICE_NAME.match(found["buffer"])
        if name is None or (name["endpoint"] is None and found["buffer"].startswith("RPC")):
            return None
        if name["endpoint"] is not None:
            return next((i for i, d in enumerate(devices.devices)
                         if d.endpoint == name["endpoint"]), None)
        return _card(devices, cards, int(name["index"]), {found["buffer"]})
    malloc = _CUDA_MALLOC.search(line)
    if malloc is None:
        return None
    index = int(malloc["index"])
    return _card(devices, cards, index, {f"CUDA{index}", f"ROCm{index}"})


def _card(devices: DeviceList, cards: list[int], backend_index: int,
          names: set[str]) -> int | None:
    """The card the build calls one of ``names``, where the list knows its cards' names;
    else the ``backend_index``-th card of the list."""
    named = [i for i in cards if devices.devices[i].listed_name in names]
    if named:
        return named[0]
    if any(devices.devices[i].listed_name for i in cards):
        return None  # the list names its cards, and not this one
    return cards[backend_index] if backend_index < len(cards) else None
