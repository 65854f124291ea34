"""What each device of a device list answers on this machine (I/O for
``harness.doctor.spread_rows``): a TCP connection to each RPC endpoint, then the RPC
build's ``llama-server --rpc <reachable endpoints> --list-devices``."""

from __future__ import annotations

import socket
from pathlib import Path

from harness.builds.resolve import pinned_cpu_build
from harness.doctor.spread_rows import DeviceAnswer
from harness.errors import HarnessError
from harness.facts.device_list import DeviceList
from harness.planning.build_plan import SUITE_BUILD
from harness.probes.devices import Device, run_list_devices

#: Seconds one endpoint may take to accept a connection.
CONNECT_TIMEOUT_S = 2.0


def device_answers(devices: DeviceList, cache: Path) -> list[DeviceAnswer]:
    """Each device's answer, in the list's order."""
    reachable = {ep: _accepts(ep) for ep in devices.rpc_endpoints}
    build = pinned_cpu_build(cache, SUITE_BUILD)
    listed: tuple[Device, ...] = ()
    why = ""
    if build is None or build.info.rpc_server is None:
        why = "no cached build with the RPC backend lists devices here"
    else:
        up = [ep for ep, ok in reachable.items() if ok]
        try:
            listing = run_list_devices(build.binary,
                                       extra_args=("--rpc", ",".join(up)) if up else ())
            listed = listing.devices()
            why = "" if listing.listed else f"--list-devices failed: {listing.stderr[-300:]}"
        except HarnessError as exc:
            why = str(exc)
    by_endpoint = {d.description: d for d in listed if d.name.startswith("RPC")}
    cards = iter(d for d in listed if not d.name.startswith("RPC"))
    answers = []
    for device in devices.devices:
        if device.endpoint is not None:
            found = by_endpoint.get(device.endpoint)
            answers.append(DeviceAnswer(reachable[device.endpoint], found,
                                        "" if found else why or "not in the listing"))
        else:
            card = next(cards, None)
            answers.append(DeviceAnswer(None, card, "" if card else
                                        why or "the build lists no GPU device for it"))
    return answers


def _accepts(endpoint: str) -> bool:
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            return True
    except OSError:
        return False
