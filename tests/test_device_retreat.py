"""Which device of a spread ran out of memory, and the supervisor's retreat off it (pure).

The RPC case is a real log (tests/data/rpc/capped-device.log: a device capped at 2 MiB
refused its 18.01 MiB share); the card cases are the lines ggml-cuda and ggml-backend
print, as the sources write them, since no GPU runs here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from test_device_plan import _model

from harness.facts.device_list import Device, DeviceKind, DeviceList
from harness.planning.launch import LaunchSpec
from harness.planning.multi_device import plan_devices
from harness.planning.planned_share import Offload
from harness.supervise.device_retreat import device_retreat
from harness.verdicts.device_oom import failed_device_index

CAPPED_LOG = (Path(__file__).parent / "data" / "rpc" / "capped-device.log").read_text()
CAPPED = "127.0.0.1:49099"


def _rpc(endpoint: str, memory_mib: int = 1000) -> Device:
    return Device(DeviceKind.RPC, endpoint, memory_mib, 0, 10.0, endpoint=endpoint)


def _card(name: str = "rtx-4090", memory_mib: int = 1000) -> Device:
    return Device(DeviceKind.CARD, name, memory_mib, 0, 1000.0)


def test_the_capped_rpc_device_is_found_by_its_endpoint() -> None:
    devices = DeviceList((_rpc("127.0.0.1:1"), _rpc(CAPPED)))
    assert failed_device_index(CAPPED_LOG, devices) == 1
    # A list without that endpoint has no device to blame.
    assert failed_device_index(CAPPED_LOG, DeviceList((_rpc("127.0.0.1:1"),))) is None


@pytest.mark.parametrize(("line", "index"), [
    ("allocating 812.00 MiB on device 1: cudaMalloc failed: out of memory", 2),
    ("ggml_backend_cuda_buffer_type_alloc_buffer: allocating 812.00 MiB on device 0: "
     "cudaMalloc failed: out of memory", 1),
    ("failed to allocate CUDA1 buffer of size 851443712", 2),
    ("llama_model_load: error loading model: unable to allocate ROCm0 buffer", 1),
    ("failed to allocate Vulkan1 buffer of size 12", 2),
    # The host's buffer, an RPC label without its endpoint, a card the list lacks.
    ("failed to allocate CPU buffer of size 851443712", None),
    ("failed to allocate RPC0 buffer of size 12", None),
    ("failed to allocate CUDA5 buffer of size 12", None),
])
def test_a_card_is_found_by_its_backend_index_after_the_rpc_devices(line: str,
                                                                   index: int | None) -> None:
    # llama.cpp's order: RPC devices first, then the build's GPUs.
    devices = DeviceList((_rpc("127.0.0.1:1"), _card(), _card()))
    assert failed_device_index(f"load_tensors: loading\n{line}\n", devices) == index


def test_a_card_the_build_listed_is_found_by_its_name() -> None:
    # Only the build's second card in the list: its index there is 0, its name CUDA1.
    second = Device(DeviceKind.CARD, "CUDA1", 1000, 0, 1000.0, listed_name="CUDA1")
    devices = DeviceList((_rpc("127.0.0.1:1"), second))
    assert failed_device_index("failed to allocate CUDA1 buffer of size 12", devices) == 1
    assert failed_device_index("allocating 8.00 MiB on device 1: cudaMalloc failed: out of "
                               "memory", devices) == 1
    assert failed_device_index("failed to allocate CUDA0 buffer of size 12", devices) is None


def test_the_retreat_moves_units_off_the_device_the_log_names() -> None:
    model = _model()
    plan = plan_devices(model, DeviceList((_rpc(CAPPED), _rpc("127.0.0.1:2"))),
                        Offload(n_gpu_layers=99), kv_bytes=0, context=256)
    spec = LaunchSpec(model=Path("m.gguf"), tensor_split=plan.tensor_split_arg)
    retreat = device_retreat(model, spec, plan, CAPPED_LOG)
    assert retreat is not None
    assert retreat.plan.shares[0].units < plan.shares[0].units
    assert retreat.spec.tensor_split == retreat.plan.tensor_split_arg != spec.tensor_split
    assert f"moved units off {CAPPED}" in retreat.action
    assert f"--tensor-split {plan.tensor_split_arg} → {retreat.plan.tensor_split_arg}" in (
        retreat.action)


def test_no_retreat_when_no_device_is_named_or_nothing_can_move() -> None:
    model = _model()
    roomy = plan_devices(model, DeviceList((_rpc(CAPPED), _rpc("127.0.0.1:2"))),
                         Offload(n_gpu_layers=99), kv_bytes=0, context=256)
    spec = LaunchSpec(model=Path("m.gguf"))
    assert device_retreat(model, spec, roomy, "failed to allocate CPU buffer of size 1") is None
    # The other device is too small to take a unit: the offload ladder's turn.
    cramped = plan_devices(model, DeviceList((_rpc(CAPPED), _rpc("127.0.0.1:2", 8))),
                           Offload(n_gpu_layers=99), kv_bytes=0, context=256)
    assert device_retreat(model, spec, cramped, CAPPED_LOG) is None
