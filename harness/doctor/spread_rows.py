"""``harness doctor --device-config``: one row per device of a device list (pure).

Each device is judged by what answered for it (``harness.doctor.spread_answers``): an RPC
endpoint must accept a connection, and a build with the RPC backend lists it as
``RPC<n>: HOST:PORT (total MiB, free MiB free)``; a card must be among the GPU devices the
build lists, in the list's order (llama.cpp's device order).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.doctor.checks import Row, Status
from harness.facts.device_list import Device, DeviceList
from harness.probes.devices import Device as ListedDevice


@dataclass(frozen=True)
class DeviceAnswer:
    """What one device of the list answered."""

    #: An RPC endpoint accepted a TCP connection (None: a card, not asked).
    reachable: bool | None = None
    #: The build's ``--list-devices`` line for it, None when it was not listed.
    listed: ListedDevice | None = None
    #: Why it could not be listed (no build with the RPC backend, the listing failed).
    unlisted_why: str = ""


def spread_rows(devices: DeviceList, answers: Sequence[DeviceAnswer]) -> list[Row]:
    """One required row per device (``answers`` in the list's order): ok when it answered
    as listed, else what to fix."""
    return [_row(index, device, answer)
            for index, (device, answer) in enumerate(zip(devices.devices, answers, strict=True))]


def _row(index: int, device: Device, answer: DeviceAnswer) -> Row:
    check = f"device {index}: {device.key}"
    planned = (f"planned {device.memory_mib} MiB ({device.reserved_mib} kept free), "
               f"{device.bandwidth_gbps:g} GB/s")
    if device.endpoint is not None and answer.reachable is False:
        host, _, port = device.endpoint.rpartition(":")
        return Row(check, Status.FAIL, f"nothing accepts connections at {device.endpoint}",
                   f"start the RPC server there: `ggml-rpc-server -H {host} -p {port}` (from "
                   "`harness build --rpc`)", required=True)
    if answer.listed is None:
        status = Status.WARN if device.endpoint is not None else Status.FAIL
        what = "answers, but " if device.endpoint is not None else ""
        return Row(check, status, f"{what}not listed: {answer.unlisted_why}; {planned}",
                   "build with the RPC backend (`harness build --rpc`)" if device.endpoint
                   else "run on the runner that has this card, or fix the list's order",
                   required=True)
    listed = answer.listed
    return Row(check, Status.OK,
               f"{listed.name}: {listed.description} ({listed.total_mib} MiB, "
               f"{listed.free_mib} MiB free); {planned}", required=True)
