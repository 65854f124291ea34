"""Multi-device: one model spread over several devices, planned, launched and verified
from the server's own log (docs/multi-device.md).

The devices are llama.cpp's RPC devices: ``ggml-rpc-server`` processes on loopback, each
under its own memory cap (an address-space limit: harness/runners/rpc_devices.py), each
one more ggml device to ``llama-server --rpc``. On a multi-GPU runner the same plan,
launch and checks run over its cards. The build needs the RPC backend and its server
(``harness build --rpc``); a build without them skips every test here and says so.

What is checked: each device holds the blocks, weights and KV cache the plan gave it
(``-lv 5``'s unit assignment lines and the per-device buffer lines), the GPU-only planned
fields show on these devices, the spread computes what one device computes, a device
that cannot hold its share fails the start with its own allocation error and the launch
supervisor's ladder moves units off it, and a device that dies mid-run is named, not
waited for.

The module stays whole: it is one suite (one capability, one Allure suite label), and its
tests share the RPC servers' fixtures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from harness import modelgen
from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.errors import ConfigError, ServerApiError
from harness.facts.build import Backend
from harness.facts.device_list import MIB, DeviceList
from harness.facts.gpu import SplitMode
from harness.numerics.fingerprint import (
    KLD_FLOOR,
    Fingerprint,
    divergence,
    record_fingerprint_of,
)
from harness.numerics.probe import greedy_distributions
from harness.numerics.token_bytes import read_token_bytes
from harness.paths import cache_root
from harness.planning.drafter import BrokenDrafters
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import LaunchPlan
from harness.plugin import PlanFor, Server, StartServer
from harness.plugin.hooks import ServerRunnerLike
from harness.probes.device_list import card_device_list, rpc_device_list
from harness.probes.devices import Device as ListedDevice
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_gpu_configs
from harness.probes.host_memory import host_memory
from harness.runners.base import RunningServer
from harness.runners.rpc_devices import RpcServer, rpc_servers
from harness.supervise.supervisor import AttemptOutcome, LaunchFailedError, LaunchSupervisor
from harness.verdicts.device_shares import check_device_shares
from harness.verdicts.failure import FailureClass
from harness.verdicts.launch_report import parse_launch_log
from harness.verdicts.plan_check import compare_launch
from harness.verdicts.rpc_failure import failed_device_allocation, rpc_failure
from harness.verdicts.unverifiable_fields import unverifiable

pytestmark = pytest.mark.server

MODEL = "bench"
#: A small context keeps each device's KV and compute buffers small beside the weights.
SETTINGS = {"ctx_size": 256, "parallel": 1}
#: What each RPC server may hold: bench's weights are 36.8 MiB, so one device holds it
#: all and two or three hold it with room to spare.
ROOMY_MIB = 96
#: A device too small for the share a wrong device list gives it: the even split puts four
#: of bench's blocks (24 MiB of weights) on the first device, and a server capped at 2 MiB
#: holds at most 18 (the cap plus the RPC server's own margin, CAP_MARGIN_BYTES).
TIGHT_MIB = 2
#: The spread and one device run the same CPU kernels: measured KL divergence 0 on every
#: position of the 48-token probe. Anything visible is a real difference.
SAME_NUMBERS_KLD = 1e-6
#: Row and tensor split sum partial products in another order, a rounding change only:
#: the fingerprint comparison's floor (measured: tensor split over two RPC devices,
#: 1.6e-6 at most over the 48-token probe, the same tokens).
SPLIT_KLD = KLD_FLOOR

Spread = Callable[..., tuple[list[RpcServer], DeviceList]]
Supervisor = LaunchSupervisor[RunningServer]


@pytest.fixture(scope="module")
def rpc_server_binary(harness_build: BuildUnderTest) -> Path:
    info = harness_build.info
    if info is None or info.rpc_server is None:
        pytest.skip(f"the build under test ({harness_build.key}) has no RPC backend and "
                    "server: build one with `harness build --rpc` and pass it with "
                    "--harness-build")
    return Path(info.rpc_server)


@pytest.fixture
def spread(rpc_server_binary: Path, tmp_path: Path) -> Iterator[Spread]:
    """``spread(caps_mib, listed_mib=None)``: RPC servers capped at ``caps_mib`` and the
    device list naming them with ``listed_mib`` (default: the caps); all stopped after."""
    stacks: list[object] = []
    bandwidth = host_memory(cache_root()).read_gbps

    def start(caps_mib: list[int], listed_mib: list[int] | None = None,
              ) -> tuple[list[RpcServer], DeviceList]:
        manager = rpc_servers(rpc_server_binary, [c * MIB for c in caps_mib],
                              tmp_path / f"rpc-{len(stacks)}")
        servers = manager.__enter__()
        stacks.append(manager)
        devices = rpc_device_list([s.endpoint for s in servers], listed_mib or caps_mib,
                                  bandwidth_gbps=bandwidth)
        return list(servers), devices

    yield start
    for manager in reversed(stacks):
        manager.__exit__(None, None, None)  # type: ignore[attr-defined]


@pytest.fixture
def supervisor(server_runner: ServerRunnerLike, harness_build: BuildUnderTest,
               fixture_set: modelgen.FixtureSet) -> Supervisor:
    """The launch supervisor for ``MODEL`` on the build under test: its ladder, its
    classification of a failed start."""
    return LaunchSupervisor(server_runner, harness_build.key, BrokenDrafters(),
                            read_model_facts(fixture_set.model(MODEL)))


def _verbose(plan: LaunchPlan) -> LaunchSpec:
    """The plan's spec at ``-lv 5``: the loader names every unit's device."""
    return dataclasses.replace(plan.spec, log_verbosity=5)


@pytest.mark.parametrize("count", [1, 2, 3])
def test_each_device_holds_its_planned_share(count: int, plan_for: PlanFor,
                                             start_server: StartServer,
                                             harness_build: BuildUnderTest,
                                             spread: Spread) -> None:
    _, devices = spread([ROOMY_MIB] * count)
    plan = plan_for(model=MODEL, devices=devices, per_call=SETTINGS)
    assert plan.devices is not None
    assert all(share.units for share in plan.devices.shares), plan.devices.describe_rows()
    server = start_server(_verbose(plan))
    report = parse_launch_log(server.log_text())
    assert report.target is not None
    checks = check_device_shares(plan.devices, report.target, n_layer=6)
    assert all(check.ok for check in checks), "\n".join(c.describe() for c in checks)
    # The GPU-only fields a CPU build cannot show are shown by the RPC devices.
    expected = {name: getattr(plan.spec, name)
                for name in ("n_gpu_layers", "split_mode", "main_gpu", "kv_offload")}
    expected["kv_offload"] = True  # the default the plan leaves unset
    assert (expected["split_mode"], expected["main_gpu"]) == (
        ("none", 0) if count == 1 else ("layer", None))
    assert unverifiable(expected, harness_build.backend, rpc_devices=True) == {}
    mismatches = compare_launch(expected, report)
    assert not mismatches, "\n".join(map(str, mismatches))


GPU_BACKENDS = [
    pytest.param(Backend.CUDA, marks=pytest.mark.gpu("cuda"), id="cuda"),
    pytest.param(Backend.ROCM, marks=pytest.mark.gpu("rocm"), id="rocm"),
    pytest.param(Backend.VULKAN, marks=pytest.mark.gpu("vulkan"), id="vulkan"),
]


def _cards(build_devices: tuple[ListedDevice, ...], backend: Backend) -> DeviceList:
    try:
        return card_device_list(build_devices, backend, load_gpu_configs())
    except ConfigError as exc:
        pytest.skip(f"the runner's cards cannot be planned for: {exc}")


def _holds_each_share(plan: LaunchPlan, start_server: StartServer,
                      backend: Backend) -> None:
    """Start ``plan`` at ``-lv 5``; every device's share and the GPU-only fields as planned."""
    assert plan.devices is not None
    server = start_server(_verbose(plan))
    report = parse_launch_log(server.log_text())
    assert report.target is not None
    checks = check_device_shares(plan.devices, report.target, n_layer=6)
    assert all(check.ok for check in checks), "\n".join(c.describe() for c in checks)
    expected = {name: getattr(plan.spec, name) for name in ("n_gpu_layers", "split_mode")}
    assert unverifiable(expected, backend) == {}
    mismatches = compare_launch(expected, report)
    assert not mismatches, "\n".join(map(str, mismatches))


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_a_spread_over_the_runners_cards_holds_each_share(
        backend: Backend, build_devices: tuple[ListedDevice, ...], plan_for: PlanFor,
        start_server: StartServer) -> None:
    """A multi-GPU runner's cards, as the build lists them (the CI files' multi-GPU cell)."""
    cards = _cards(build_devices, backend)
    if len(cards.devices) < 2:
        pytest.skip(f"the build lists {len(cards.devices)} {backend.value} device(s); a spread "
                    f"over cards needs two (a multi-GPU runner: --harness-require-gpu "
                    f"{backend.value}:2 fails the run instead of skipping)")
    plan = plan_for(model=MODEL, devices=cards, per_call=SETTINGS)
    assert plan.devices is not None
    assert all(share.units for share in plan.devices.shares), plan.devices.describe_rows()
    _holds_each_share(plan, start_server, backend)


@pytest.mark.parametrize("backend", GPU_BACKENDS)
def test_a_spread_over_an_rpc_device_and_a_card_holds_each_share(
        backend: Backend, build_devices: tuple[ListedDevice, ...], plan_for: PlanFor,
        start_server: StartServer, spread: Spread) -> None:
    """One RPC device and the runner's first card (the device check's split): llama.cpp
    puts RPC devices before the build's own, so the list does too."""
    card = _cards(build_devices, backend).devices[:1]
    _, rpc = spread([ROOMY_MIB])
    devices = DeviceList((*rpc.devices, *card), "an RPC server and the runner's first card")
    plan = plan_for(model=MODEL, devices=devices, per_call=SETTINGS)
    assert plan.devices is not None
    assert all(share.units for share in plan.devices.shares), plan.devices.describe_rows()
    _holds_each_share(plan, start_server, backend)


def test_a_device_the_launch_left_unused_fails_by_name(plan_for: PlanFor,
                                                       start_server: StartServer,
                                                       spread: Spread) -> None:
    _, devices = spread([ROOMY_MIB, ROOMY_MIB])
    plan = plan_for(model=MODEL, devices=devices, per_call=SETTINGS)
    assert plan.devices is not None
    # A launch path that drops the plan's split: every unit on the first device.
    units = plan.devices.n_gpu_layers
    server = start_server(dataclasses.replace(_verbose(plan), tensor_split=f"{units},0"))
    report = parse_launch_log(server.log_text())
    assert report.target is not None
    first, second = check_device_shares(plan.devices, report.target, n_layer=6)
    assert not second.ok
    assert f"the plan gave {devices.devices[1].key}" in second.describe()
    assert "left unused" in second.describe()
    assert not first.ok  # it holds more than planned, and says so
    assert "weights" in first.describe()


def test_one_device_and_the_spread_compute_the_same_numbers(fixture_set: modelgen.FixtureSet,
                                                            plan_for: PlanFor,
                                                            start_server: StartServer,
                                                            spread: Spread) -> None:
    """One RPC device against two: the same CPU kernels behind both on any build (a GPU
    build's own card is left out by ``--device``), so only the split can differ."""
    model = fixture_set.model(MODEL)
    _, alone = spread([ROOMY_MIB])
    _, devices = spread([ROOMY_MIB, ROOMY_MIB])
    fingerprints = []
    for plan in (plan_for(model=MODEL, devices=alone, per_call=SETTINGS),
                 plan_for(model=MODEL, devices=devices, per_call=SETTINGS)):
        assert plan.devices is not None
        # Exactly the planned devices, by the names llama-server lists them by.
        assert plan.spec.device == ",".join(f"RPC{i}" for i in range(len(plan.devices.shares)))
        server = start_server(plan.spec)
        fingerprints.append(_greedy_fingerprint(server, model))
        server.stop()
    _assert_same_numbers(*fingerprints, max_kld=SAME_NUMBERS_KLD, what="the spread")


@pytest.mark.parametrize("mode", [SplitMode.ROW, SplitMode.TENSOR])
def test_row_and_tensor_split_compute_what_one_device_computes_or_are_refused(
        mode: SplitMode, fixture_set: modelgen.FixtureSet, plan_for: PlanFor,
        supervisor: Supervisor, spread: Spread) -> None:
    """``--split-mode row`` and ``tensor`` over RPC devices: where the server refuses the
    mode at load (measured on the pinned build: row needs split buffers, which RPC devices
    lack), the test skips with the server's own words; any other failure fails, and a
    mode that serves must compute what one device computes (#13545 is row split giving
    gibberish on HIP)."""
    _, devices = spread([ROOMY_MIB, ROOMY_MIB])
    model = fixture_set.model(MODEL)
    plan = plan_for(model=MODEL, devices=devices, per_call={**SETTINGS, "split_mode": mode})
    assert plan.spec.split_mode == mode  # the mode asked for stays
    try:
        split = supervisor.launch(plan)
    except LaunchFailedError as exc:
        if exc.failure.kind is not FailureClass.MODEL_LOAD:
            raise
        pytest.skip(f"--split-mode {mode.value} across RPC devices: the server refused it at "
                    f"load: {exc.failure.evidence}")
    try:
        spread_over = _greedy_fingerprint(split.server, model)
    finally:
        split.server.stop()
    _, alone_device = spread([ROOMY_MIB])
    one = supervisor.launch(plan_for(model=MODEL, devices=alone_device, per_call=SETTINGS))
    try:
        alone = _greedy_fingerprint(one.server, model)
    finally:
        one.server.stop()
    _assert_same_numbers(alone, spread_over, max_kld=SPLIT_KLD,
                         what=f"the --split-mode {mode.value} split")


def _assert_same_numbers(one: Fingerprint, other: Fingerprint, *, max_kld: float,
                         what: str) -> None:
    """``other`` (``what``) has one device's greedy tokens, within ``max_kld``."""
    change = divergence(one, other)
    assert change.first_difference is None, (
        f"{what}: the greedy token differs at position {change.first_difference}: one "
        f"device {one.tokens}, {what} {other.tokens}")
    assert change.max_kld <= max_kld, (
        f"{what}: KL divergence {change.max_kld:.3g} at position {change.at}, over "
        f"{max_kld:g}")


def _greedy_fingerprint(server: Server, model: Path) -> Fingerprint:
    token_bytes = read_token_bytes(model)
    with ServerClient(server.base_url) as client:
        _, reported = greedy_distributions(client, len(token_bytes), token_bytes)
    return record_fingerprint_of(reported)


def test_a_device_that_cannot_hold_its_share_fails_and_the_ladder_moves_units_off_it(
        plan_for: PlanFor, supervisor: Supervisor, spread: Spread) -> None:
    # The device list says both hold ROOMY_MIB; the first server is capped far below.
    servers, devices = spread([TIGHT_MIB, ROOMY_MIB], [ROOMY_MIB, ROOMY_MIB])
    tight = servers[0]
    plan = plan_for(model=MODEL, devices=devices, per_call=SETTINGS)
    assert plan.devices is not None
    launch = supervisor.launch(dataclasses.replace(plan, spec=_verbose(plan)))
    try:
        *failed, served = launch.attempts
        # Each failed start was the capped device's own: llama-server names its endpoint,
        # and the RPC server itself logged the allocation it refused.
        assert failed, "the capped device held the even share: the cap did not bite"
        for attempt in failed:
            assert attempt.failure is not None
            assert attempt.failure.kind is FailureClass.OUT_OF_MEMORY, attempt.failure
            assert failed_device_allocation(attempt.log_text) == (
                tight.endpoint, mock.ANY), attempt.log_text[-2000:]
            assert f"moved units off {tight.endpoint}" in attempt.action, attempt.action
        assert "insufficient memory" in tight.log_text()
        assert served.outcome is AttemptOutcome.SERVED
        final = launch.devices
        assert final is not None
        assert final.shares[0].units < plan.devices.shares[0].units
        assert served.spec.tensor_split == final.tensor_split_arg
        report = parse_launch_log(launch.server.log_text())
        assert report.target is not None
        checks = check_device_shares(final, report.target, n_layer=6)
        assert all(check.ok for check in checks), "\n".join(c.describe() for c in checks)
    finally:
        launch.server.stop()


@pytest.mark.timeout(120)
def test_a_device_killed_mid_run_is_named_not_waited_for(plan_for: PlanFor,
                                                        start_server: StartServer,
                                                        spread: Spread) -> None:
    servers, devices = spread([ROOMY_MIB, ROOMY_MIB])
    server = start_server(plan_for(model=MODEL, devices=devices, per_call=SETTINGS).spec)
    with ServerClient(server.base_url) as client:
        assert client.completion("The sea", n_predict=4).tokens_predicted == 4
        servers[1].kill()
        with pytest.raises(ServerApiError) as caught:
            client.completion("The sea was calm", n_predict=8)
    gone = {s.endpoint: s.exit_code() for s in servers if not s.alive()}
    said = rpc_failure(server.log_text(), gone)
    assert said is not None, f"no RPC failure found after: {caught.value}"
    assert f"RPC device {servers[1].endpoint} is gone" in said
    assert "llama-server aborted" in said
