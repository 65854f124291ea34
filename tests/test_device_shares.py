"""Each device's share read from real RPC logs (tests/data/rpc/README.md) and held to a
plan; the RPC failures named by device."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pytest

from harness import modelgen
from harness.facts.build import Backend
from harness.facts.device_list import DeviceList
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.multi_device import DevicePlan
from harness.probes.device_list import rpc_device_list
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_fork_kv_types
from harness.verdicts.block_report import BlockReport
from harness.verdicts.device_shares import check_device_shares, observed_shares
from harness.verdicts.launch_report import parse_launch_log
from harness.verdicts.plan_check import compare_launch
from harness.verdicts.rpc_failure import failed_device_allocation, rpc_failure
from harness.verdicts.unverifiable_fields import unverifiable

DATA = Path(__file__).parent / "data" / "rpc"
FIRST, SECOND = "127.0.0.1:50111", "127.0.0.1:50112"


@pytest.fixture(scope="module")
def spread_log() -> str:
    return (DATA / "spread-killed.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def target(spread_log: str) -> BlockReport:
    report = parse_launch_log(spread_log)
    assert report.target is not None
    return report.target


def _plan(fixture_set: modelgen.FixtureSet, devices: DeviceList) -> DevicePlan:
    path = fixture_set.model("bench")
    plan = plan_launch(PlanRequest(model_path=path, model=read_model_facts(path),
                                   devices=devices, per_call={"ctx_size": 256, "parallel": 1},
                                   fork_kv_types=load_fork_kv_types()))
    assert plan.devices is not None
    return plan.devices


def test_each_device_is_read_by_its_endpoint(target: BlockReport) -> None:
    seen = observed_shares(target)
    assert set(seen) == {FIRST, SECOND}
    first, second = seen[FIRST], seen[SECOND]
    assert (first.device_name, first.model_mib, first.kv_mib, first.compute_mib) == (
        "RPC0", Decimal("18.01"), Decimal("0.38"), Decimal("9.53"))
    assert (second.device_name, second.model_mib, second.compute_mib) == (
        "RPC1", Decimal("18.40"), Decimal("6.14"))
    # The fit dry run's 0.00 MiB buffers are not counted: they are another block.
    assert first.layers == (0, 1, 2)
    assert second.layers == (3, 4, 5, 6)


def test_the_log_holds_the_plan_that_made_it(fixture_set: modelgen.FixtureSet,
                                             target: BlockReport) -> None:
    plan = _plan(fixture_set, rpc_device_list([FIRST, SECOND], [96, 96], bandwidth_gbps=10))
    assert plan.tensor_split == (3, 4)  # what the logged server was started with
    checks = check_device_shares(plan, target, n_layer=6)
    assert all(c.ok for c in checks), "\n".join(c.describe() for c in checks)


def test_a_share_other_than_planned_is_named(fixture_set: modelgen.FixtureSet,
                                             target: BlockReport) -> None:
    # A first device with twice the memory is planned 4 units; the log shows 3.
    plan = _plan(fixture_set, rpc_device_list([FIRST, SECOND], [192, 96], bandwidth_gbps=10))
    assert plan.tensor_split[0] > 3
    first, second = check_device_shares(plan, target, n_layer=6)
    assert not first.ok
    assert "weights 18.01 MiB, planned" in first.describe()
    assert "units 0-2, planned 0-" in first.describe()
    assert not second.ok


def test_a_planned_device_absent_from_the_log_is_left_unused(
        fixture_set: modelgen.FixtureSet, target: BlockReport) -> None:
    third = "127.0.0.1:50113"
    plan = _plan(fixture_set, rpc_device_list([FIRST, SECOND, third], [96] * 3,
                                              bandwidth_gbps=10))
    checks = check_device_shares(plan, target, n_layer=6)
    unused = next(c for c in checks if c.planned.device.key == third)
    assert unused.observed is None
    assert f"the plan gave {third}" in unused.describe()
    assert "left unused" in unused.describe()


def test_the_gpu_only_fields_show_on_rpc_devices(spread_log: str) -> None:
    expected: dict[str, object] = {"n_gpu_layers": 7, "split_mode": "layer",
                                   "kv_offload": True}
    assert set(unverifiable(expected, Backend.CPU)) == set(expected)
    assert unverifiable(expected, Backend.CPU, rpc_devices=True) == {}
    assert compare_launch(expected, parse_launch_log(spread_log)) == ()
    wrong = compare_launch({"n_gpu_layers": 5, "split_mode": "none"},
                           parse_launch_log(spread_log))
    assert {m.field for m in wrong} == {"n_gpu_layers", "split_mode"}


def test_a_killed_device_is_named(spread_log: str) -> None:
    said = rpc_failure(spread_log, {SECOND: -9})
    assert said is not None
    assert f"RPC device {SECOND} is gone: its rpc-server exited with -9" in said
    assert "'Remote RPC server crashed or returned malformed response'" in said
    assert rpc_failure("nothing about devices here", {}) is None
    unreachable = rpc_failure("ggml-rpc.cpp:547: Failed to connect to 127.0.0.1:9\n", {})
    assert unreachable is not None
    assert "Failed to connect to 127.0.0.1:9" in unreachable


def test_a_capped_devices_refusal_names_the_device_and_the_size(spread_log: str) -> None:
    log = (DATA / "capped-device.log").read_text(errors="replace")
    assert failed_device_allocation(log) == ("127.0.0.1:49099", 18883584)
    assert failed_device_allocation(spread_log) is None
