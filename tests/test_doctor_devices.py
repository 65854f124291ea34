"""``harness doctor --device-config``: one row per device, from what it answers here —
real RPC servers of the RPC build, and an endpoint nobody listens at."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
from click.testing import CliRunner

from harness.builds.native import BuildResult
from harness.builds.resolve import ensure_build
from harness.commands.doctor import doctor_command
from harness.doctor.checks import Status
from harness.doctor.spread_rows import DeviceAnswer, spread_rows
from harness.facts.device_list import Device, DeviceKind, DeviceList
from harness.planning.build_plan import SUITE_BUILD
from harness.probes.devices import Device as ListedDevice
from harness.runners.rpc_devices import rpc_servers


@pytest.fixture(scope="module")
def rpc_build(harness_cache: Path) -> BuildResult:
    return ensure_build(harness_cache, SUITE_BUILD)


def _unused_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.server
def test_each_rpc_device_is_listed_or_named_with_its_fix(rpc_build: BuildResult,
                                                         harness_cache: Path,
                                                         tmp_path: Path) -> None:
    assert rpc_build.info.rpc_server is not None
    dead = f"127.0.0.1:{_unused_port()}"
    with rpc_servers(Path(rpc_build.info.rpc_server), (None,), tmp_path / "rpc") as (server,):
        config = tmp_path / "devices.json"
        config.write_text(json.dumps({"devices": [
            {"rpc": server.endpoint, "memory_mib": 64, "bandwidth_gbps": 10},
            {"rpc": dead, "memory_mib": 64, "bandwidth_gbps": 10}]}))
        result = CliRunner().invoke(doctor_command, ["--device-config", str(config), "--json"],
                                    env={"HARNESS_CACHE": str(harness_cache)})
    data = json.loads(result.output)
    rows = {row["check"]: row for row in data["rows"] if row["check"].startswith("device ")}
    up, down = rows[f"device 0: {server.endpoint}"], rows[f"device 1: {dead}"]
    assert up["status"] == "ok"
    assert up["detail"].startswith(f"RPC0: {server.endpoint} (")
    assert down["status"] == "fail"
    assert f"nothing accepts connections at {dead}" in down["detail"]
    assert "ggml-rpc-server -H 127.0.0.1 -p" in down["fix"]
    assert data["exit_code"] == result.exit_code == 1


def test_a_card_the_build_does_not_list_fails_and_one_it_lists_passes() -> None:
    cards = DeviceList((Device(DeviceKind.CARD, "rtx-4090", 24564, 1024, 1008.0),
                        Device(DeviceKind.CARD, "rtx-4090", 24564, 1024, 1008.0)))
    listed = ListedDevice(name="CUDA0", backend=None, description="NVIDIA GeForce RTX 4090",
                          total_mib=24564, free_mib=24000)
    first, second = spread_rows(cards, [DeviceAnswer(listed=listed),
                                        DeviceAnswer(unlisted_why="the build lists one GPU")])
    assert (first.status, second.status) == (Status.OK, Status.FAIL)
    assert first.detail.startswith("CUDA0: NVIDIA GeForce RTX 4090 (24564 MiB")
    assert "the build lists one GPU" in second.detail
    assert "runner that has this card" in second.fix
