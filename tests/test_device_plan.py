"""The multi-device plan (harness/planning/multi_device.py): llama.cpp's unit-to-device
rule, the equal-headroom spread, the fallback in order, and the flags it sends."""

from __future__ import annotations

import dataclasses
import itertools
import subprocess
from pathlib import Path

import pytest
from test_plan_cli import HARNESS, plan_json

from harness import modelgen
from harness.facts.device_list import Device, DeviceKind, DeviceList
from harness.facts.model_facts import LayerBytes, ModelFacts
from harness.planning.device_speed import predict_spread
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.multi_device import (
    assigned_units,
    moved_off,
    plan_devices,
    step_down,
)
from harness.planning.planned_share import Offload
from harness.probes.device_list import rpc_device_list
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_fork_kv_types

MIB = 1024 * 1024


def _model(blocks: int = 6, *, block_mib: int = 10, expert_mib: int = 0) -> ModelFacts:
    return ModelFacts(
        path="m.gguf", file_size=0, architecture="llama", block_count=blocks,
        context_length=4096, embedding_length=64, head_count=4, head_count_kv=(4,) * blocks,
        key_length=16, value_length=16, vocab_size=1000,
        expert_count=8 if expert_mib else 0, expert_used_count=2 if expert_mib else 0,
        layer_bytes=tuple(LayerBytes(i, expert_mib * MIB, block_mib * MIB, 0)
                          for i in range(blocks)),
        output_bytes=4 * MIB)


def _rpc(*memory_mib: int) -> DeviceList:
    return DeviceList(tuple(
        Device(DeviceKind.RPC, f"127.0.0.1:{5000 + i}", memory, 0, 10.0,
               endpoint=f"127.0.0.1:{5000 + i}")
        for i, memory in enumerate(memory_mib)))


def test_assigned_units_is_llamas_rule_as_measured_on_bench() -> None:
    # -ts 3,4 on bench (6 blocks, -ngl 99): the server logged blocks 0-2 on RPC0 and
    # blocks 3-5 with the output layer on RPC1.
    assert assigned_units([3, 4], 6, 99) == (0, 0, 0, 1, 1, 1, 1)
    # -ngl 4 leaves blocks 0-2 on the host: the split counts the 4 offloaded units.
    assert assigned_units([1, 3], 6, 4) == (0, 1, 1, 1)
    # A zero share gives that device nothing.
    assert assigned_units([0, 7], 6, 99) == (1,) * 7
    assert assigned_units([1, 1], 6, 0) == ()


def test_equal_devices_split_the_units_evenly_with_the_output_on_the_last() -> None:
    plan = plan_devices(_model(), _rpc(1000, 1000), Offload(n_gpu_layers=99), kv_bytes=0,
                        context=512)
    assert plan.tensor_split in ((4, 3), (3, 4))
    first, last = plan.shares
    assert first.blocks == tuple(range(first.units))
    assert last.holds_output
    assert not first.holds_output
    assert (plan.split_mode, plan.main_gpu, plan.n_gpu_layers, plan.spread) == (
        "layer", None, 7, "equal headroom")
    assert plan.rpc_arg == "127.0.0.1:5000,127.0.0.1:5001"
    # The flags ask llama.cpp for exactly the ranges planned.
    owner = assigned_units(plan.tensor_split, 6, plan.n_gpu_layers)
    assert [owner.count(k) for k in (0, 1)] == [s.units for s in plan.shares]


def test_a_device_with_twice_the_memory_gets_about_twice_the_units() -> None:
    plan = plan_devices(_model(9, block_mib=10), _rpc(100, 200), Offload(n_gpu_layers=99),
                        kv_bytes=0, context=0)
    assert plan.fits
    assert plan.tensor_split[1] >= 2 * plan.tensor_split[0] - 1
    assert plan.shares[0].used_bytes / plan.shares[0].device.budget_bytes == pytest.approx(
        plan.shares[1].used_bytes / plan.shares[1].device.budget_bytes, abs=0.15)


def test_kv_and_compute_are_counted_per_device() -> None:
    plan = plan_devices(_model(), _rpc(1000, 1000), Offload(n_gpu_layers=99),
                        kv_bytes=6 * MIB, context=1024)
    assert sum(s.kv_bytes for s in plan.shares) == 6 * MIB
    assert all(s.compute_bytes == int(1024 * 3.5 * 1024 / 2) for s in plan.shares)
    assert plan.shares[0].kv_bytes == len(plan.shares[0].blocks) * MIB


def test_when_headroom_cannot_be_equal_devices_fill_in_order() -> None:
    # 45 MiB then 30 MiB: the equal-fraction spread puts 4 blocks on the first device
    # (40 MiB of 45) and 2 + output on the second (24 of 30): fits. Shrink the second so
    # only the output and one block fit there.
    plan = plan_devices(_model(), _rpc(55, 15), Offload(n_gpu_layers=99), kv_bytes=0,
                        context=0)
    assert plan.fits
    assert plan.tensor_split == (5, 2)
    assert plan.shares[1].layer_range() == "block 5 + output"


def test_a_model_larger_than_every_device_is_over_budget_and_says_so() -> None:
    plan = plan_devices(_model(), _rpc(20, 20), Offload(n_gpu_layers=99), kv_bytes=0,
                        context=0)
    assert not plan.fits
    assert plan.spread == "over budget"
    assert "over its budget" in " ".join(plan.describe_rows())


def test_one_device_is_split_mode_none_on_it() -> None:
    plan = plan_devices(_model(), _rpc(1000), Offload(n_gpu_layers=99), kv_bytes=0, context=0)
    assert (plan.split_mode, plan.main_gpu, plan.tensor_split) == ("none", 0, (7,))


def test_host_kept_experts_are_not_on_the_devices() -> None:
    plan = plan_devices(_model(expert_mib=20), _rpc(1000, 1000),
                        Offload(n_gpu_layers=99, n_cpu_moe=6), kv_bytes=0, context=0)
    assert sum(s.weight_bytes for s in plan.shares) == (6 * 10 + 4) * MIB


def test_blocks_left_on_the_host_are_on_no_device() -> None:
    plan = plan_devices(_model(), _rpc(1000, 1000), Offload(n_gpu_layers=3), kv_bytes=0,
                        context=0)
    assert plan.n_gpu_layers == 3
    assert sorted(b for s in plan.shares for b in s.blocks) == [4, 5]


@pytest.fixture(scope="module")
def bench(fixture_set: modelgen.FixtureSet) -> tuple[Path, ModelFacts]:
    path = fixture_set.model("bench")
    return path, read_model_facts(path)


def test_the_launch_plan_sends_the_spread_and_says_where_each_field_came_from(
        bench: tuple[Path, ModelFacts]) -> None:
    path, model = bench
    devices = rpc_device_list(["127.0.0.1:7001", "127.0.0.1:7002"], [64, 48],
                              bandwidth_gbps=10)
    plan = plan_launch(PlanRequest(model_path=path, model=model, devices=devices,
                                   fork_kv_types=load_fork_kv_types()))
    argv = plan.to_argv("llama-server", "127.0.0.1", 0)
    assert plan.devices is not None
    assert argv[argv.index("--rpc") + 1] == "127.0.0.1:7001,127.0.0.1:7002"
    assert argv[argv.index("--tensor-split") + 1] == plan.devices.tensor_split_arg
    assert argv[argv.index("--n-gpu-layers") + 1] == str(model.block_count + 1)
    assert argv[argv.index("--split-mode") + 1] == "layer"
    assert {plan.origins[f] for f in ("rpc", "tensor_split", "split_mode", "n_gpu_layers")} \
        == {"devices"}
    # Round trip: the argv parses back to the same spec.
    assert LaunchSpec.from_argv(argv) == plan.spec
    assert plan.to_json()["devices"]["shares"][1]["output"] is True


def test_a_split_mode_the_user_asked_for_stays(bench: tuple[Path, ModelFacts]) -> None:
    path, model = bench
    devices = rpc_device_list(["127.0.0.1:7001", "127.0.0.1:7002"], [64, 64],
                              bandwidth_gbps=10)
    plan = plan_launch(PlanRequest(model_path=path, model=model, devices=devices,
                                   per_call={"split_mode": "row"},
                                   fork_kv_types=load_fork_kv_types()))
    assert (plan.spec.split_mode, plan.origins["split_mode"]) == ("row", "call")


@pytest.mark.parametrize("devices", ["two-cards.json", "rpc-loopback.json"])
def test_harness_plan_shows_each_devices_share(devices: str,
                                               bench: tuple[Path, ModelFacts]) -> None:
    config = GPU_CONFIG_DIR / "devices" / devices
    data = plan_json("--model", str(bench[0]), "--device-config", str(config))
    shares = data["devices"]["shares"]
    assert len(shares) == 2
    assert sorted(b for s in shares for b in s["blocks"]) == list(range(bench[1].block_count))
    assert [s["output"] for s in shares] == [False, True]
    assert data["decode_prediction"][0]["devices"][1]["bytes_per_token"] > 0
    text = subprocess.run([*HARNESS, "plan", "--model", str(bench[0]), "--device-config",
                           str(config)], capture_output=True, text=True, timeout=120,
                          check=True).stdout
    assert f"--tensor-split {data['devices']['tensor_split'][0]}," in text
    assert "+ output" in text


def test_the_spread_prediction_adds_each_devices_time_and_its_hop() -> None:
    model = _model()
    slow = DeviceList((*_rpc(1000).devices, Device(DeviceKind.RPC, "127.0.0.1:9", 1000, 0,
                                                   5.0, "127.0.0.1:9", hop_latency_us=100)))
    plan = plan_devices(model, slow, Offload(n_gpu_layers=99), kv_bytes=0, context=0)
    predicted = predict_spread(model, plan, None, host_gbps=10, depth=512)
    first, second = predicted.devices
    assert first.seconds == pytest.approx(first.bytes_per_token / (10e9 * 0.7))
    assert second.seconds == pytest.approx(second.bytes_per_token / (5e9 * 0.7) + 1e-4)
    assert first.bytes_per_token + second.bytes_per_token == (6 * 10 + 4) * MIB
    assert predicted.tokens_per_s == pytest.approx(1 / (first.seconds + second.seconds))


def test_a_step_down_moves_at_least_one_unit_off_the_device_that_ran_out() -> None:
    plan = plan_devices(_model(), _rpc(1000, 1000), Offload(n_gpu_layers=99), kv_bytes=0,
                        context=0)
    steps = [plan.shares[1].units]
    for _ in range(10):
        plan = plan_devices(_model(), step_down(plan, 1), Offload(n_gpu_layers=99),
                            kv_bytes=0, context=0)
        steps.append(plan.shares[1].units)
        if not plan.shares[1].units:
            break
    assert all(later < earlier for earlier, later in itertools.pairwise(steps)), steps
    assert steps[-1] == 0
    assert plan.shares[0].units == 7  # the other device took every unit
    with pytest.raises(IndexError):
        step_down(plan, 2)


def test_two_cards_of_one_name_step_down_one_at_a_time() -> None:
    card = Device(kind=DeviceKind.CARD, name="rtx-4090", memory_mib=1000, reserved_mib=0,
                  bandwidth_gbps=1000.0)
    plan = plan_devices(_model(), DeviceList((card, card)), Offload(n_gpu_layers=99),
                        kv_bytes=0, context=0)
    stepped = step_down(plan, 0).devices
    assert stepped[0].memory_mib < 1000
    assert stepped[1] == card


def test_a_retreat_plans_again_from_the_same_inputs_or_says_nothing_can_move() -> None:
    model = _model()
    plan = plan_devices(model, _rpc(1000, 1000), Offload(n_gpu_layers=99), kv_bytes=6 * MIB,
                        context=512)
    following = moved_off(model, plan, 0)
    assert following is not None
    assert following.shares[0].units < plan.shares[0].units
    assert (following.kv_bytes, following.context) == (6 * MIB, 512)
    assert sum(following.tensor_split) == sum(plan.tensor_split)  # -ngl is unchanged
    # A second device too small to take what moves: the retreat is the offload ladder's.
    cramped = plan_devices(model, _rpc(1000, 8), Offload(n_gpu_layers=99), kv_bytes=0,
                           context=0)
    assert moved_off(model, cramped, 0) is None
    # A device that holds nothing has nothing to move.
    empty = plan_devices(model, _rpc(1000, 1000), Offload(n_gpu_layers=0), kv_bytes=0,
                         context=0)
    assert moved_off(model, empty, 1) is None


def test_the_device_flag_names_exactly_the_planned_devices_where_their_names_are_known() -> None:
    rpc = _rpc(1000, 1000)
    assert plan_devices(_model(), rpc, Offload(n_gpu_layers=99), kv_bytes=0,
                        context=0).device_arg == "RPC0,RPC1"
    listed = Device(kind=DeviceKind.CARD, name="CUDA0", memory_mib=1000, reserved_mib=0,
                    bandwidth_gbps=1000.0, listed_name="CUDA0")
    mixed = DeviceList((rpc.devices[0], listed))
    assert plan_devices(_model(), mixed, Offload(n_gpu_layers=99), kv_bytes=0,
                        context=0).device_arg == "RPC0,CUDA0"
    # A card from a config file has no name the build lists: every device is left on.
    configured = DeviceList((rpc.devices[0], dataclasses.replace(listed, listed_name=None)))
    plan = plan_devices(_model(), configured, Offload(n_gpu_layers=99), kv_bytes=0, context=0)
    assert plan.device_arg is None
    # --device after --rpc: llama-server looks the RPC device's name up as it parses it.
    spec = LaunchSpec(model=Path("m.gguf"), rpc="127.0.0.1:1", device="RPC0")
    argv = spec.to_argv("llama-server", "127.0.0.1", 8080)
    assert argv.index("--rpc") < argv.index("--device")
