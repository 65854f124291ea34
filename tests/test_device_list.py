"""Device lists (``--device-config``): the shipped examples load, and every bad file is
refused with the file, the entry and the fix."""

from __future__ import annotations

import contextlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.facts.device_list import DeviceKind
from harness.probes.device_list import card_device_list, load_device_list, rpc_device_list
from harness.probes.devices import parse_device_list
from harness.probes.gpu_configs import GPU_CONFIG_DIR, load_gpu_configs

CARDS = load_gpu_configs()
EXAMPLES = sorted((GPU_CONFIG_DIR / "devices").glob("*.json"))


def _write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "devices.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_the_shipped_device_lists_load(path: Path) -> None:
    devices = load_device_list(path, CARDS).devices
    assert len(devices) >= 2
    assert all(d.budget_bytes > 0 and d.bandwidth_gbps > 0 for d in devices)


def test_a_card_takes_its_configs_figures_and_an_rpc_entry_its_own(tmp_path: Path) -> None:
    card = next(c for c in CARDS if c.name == "rtx-3090")
    listed = load_device_list(_write(tmp_path, {"devices": [
        {"rpc": "127.0.0.1:50052", "memory_mib": 300, "bandwidth_gbps": 12.5,
         "hop_latency_us": 80},
        {"card": "rtx-3090"}]}), CARDS)
    second, first = listed.devices
    assert (first.kind, first.memory_mib, first.reserved_mib, first.bandwidth_gbps) == (
        DeviceKind.CARD, card.vram_mib, card.reserved_headroom_mib, card.memory_bandwidth_gbps)
    assert first.key == "rtx-3090"
    assert (second.kind, second.key, second.budget_bytes, second.hop_latency_us) == (
        DeviceKind.RPC, "127.0.0.1:50052", 300 * 1024 * 1024, 80.0)
    assert listed.rpc_endpoints == ("127.0.0.1:50052",)


@pytest.mark.parametrize(("devices", "says"), [
    ([{"card": "no-such-card"}], "no card config is named 'no-such-card'"),
    ([{"card": "rtx-3090", "memory_mib": 10**6}], "more than rtx-3090's"),
    ([{"rpc": "127.0.0.1:1", "memory_mib": 8, "bandwidth_gbps": 1}] * 2, "listed twice"),
    ([{"rpc": "127.0.0.1:70000", "memory_mib": 8, "bandwidth_gbps": 1}], "no valid port"),
    ([{"rpc": "127.0.0.1:5", "bandwidth_gbps": 1}], "memory_mib"),
    ([], "devices"),
    # llama.cpp puts RPC devices before the build's own: a card first cannot be that order.
    ([{"card": "rtx-3090"}, {"rpc": "127.0.0.1:5", "memory_mib": 8, "bandwidth_gbps": 1}],
     "list the RPC endpoints first"),
])
def test_a_bad_list_names_the_file_and_the_problem(tmp_path: Path, devices: object,
                                                  says: str) -> None:
    path = _write(tmp_path, {"devices": devices})
    with pytest.raises(ConfigError) as caught:
        load_device_list(path, CARDS)
    assert says in str(caught.value)
    assert str(path) in str(caught.value)


def test_two_cards_of_one_model_are_two_devices(tmp_path: Path) -> None:
    listed = load_device_list(_write(tmp_path, {"devices": [{"card": "rtx-3090"}] * 2}), CARDS)
    assert len(listed.devices) == 2


def test_the_builds_own_cards_become_a_device_list_in_its_order() -> None:
    # As a CUDA build with the RPC backend lists them (`llama-server --list-devices`).
    listed = parse_device_list(
        "Available devices:\n"
        "  RPC0: 127.0.0.1:50052 (24105 MiB, 24105 MiB free)\n"
        "  CUDA0: NVIDIA H200 (143771 MiB, 143000 MiB free)\n"
        "  CUDA1: NVIDIA GeForce RTX 4090 (24080 MiB, 23500 MiB free)\n")
    cards = load_gpu_configs()
    devices = card_device_list(listed, Backend.CUDA, cards)
    assert [(d.name, d.kind, d.memory_mib) for d in devices.devices] == [
        ("CUDA0", DeviceKind.CARD, 143000), ("CUDA1", DeviceKind.CARD, 23500)]
    assert devices.listed_names == ("CUDA0", "CUDA1")
    h200 = next(c for c in cards if c.name == "h200")
    assert devices.devices[0].reserved_mib == h200.reserved_headroom_mib
    assert devices.devices[0].bandwidth_gbps == h200.memory_bandwidth_gbps
    assert card_device_list(listed, Backend.ROCM, cards).devices == ()
    unknown = parse_device_list("  CUDA0: Some Future Card (1000 MiB, 900 MiB free)\n")
    with pytest.raises(ConfigError, match="CUDA0 \\(Some Future Card\\) matches no card"):
        card_device_list(unknown, Backend.CUDA, cards)


def test_rpc_device_list_pairs_endpoints_with_their_memory() -> None:
    listed = rpc_device_list(["127.0.0.1:1", "127.0.0.1:2"], [64, 32], bandwidth_gbps=5)
    assert [d.memory_mib for d in listed.devices] == [64, 32]
    with pytest.raises(ValueError, match="one memory figure"):
        rpc_device_list(["127.0.0.1:1"], [1, 2], bandwidth_gbps=5)


@settings(max_examples=150, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.sampled_from(["devices", "card", "rpc", "memory_mib",
                                                       "bandwidth_gbps", "x"]), inner,
                                      max_size=4), max_leaves=12))
def test_any_json_loads_or_is_refused_as_a_config_error(data: object) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = _write(Path(folder), data)
        with contextlib.suppress(ConfigError):
            load_device_list(path, CARDS)
