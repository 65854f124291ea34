"""A ROCm build's launch environment, on captured and composed device listings.

No AMD GPU reaches this machine, so the devices come from logs: the MI300X listing is
``tests/data/logs/rocm/used.log`` (ggml-cuda's init lines under HIP), the two-card
listing below is written from the same format string
(ggml/src/ggml-cuda/ggml-cuda.cu ``ggml_cuda_init``). The real ROCm image's own probe and
launch with the planned environment are in suites/test_gpu_unused_images.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.capabilities import bare_binary_info
from harness.builds.devices_seen import devices_seen, plan_launch_env
from harness.builds.under_test import BuildUnderTest
from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.planning.rocm_env import (
    KERNEL_PACKS_VARIABLE,
    NONE_VISIBLE,
    VISIBILITY_VARIABLE,
    RocmDevice,
    RocmLaunchEnv,
    build_targets,
    parse_rocm_devices,
    plan_rocm_env,
    runs_on,
)
from harness.probes.gguf_facts import read_model_facts
from harness.verdicts.gpu_use import GpuState, gpu_verdict

LOGS = Path(__file__).parent / "data" / "logs" / "rocm"
#: What ``--list-devices`` prints on stderr on a host with an MI300X and an RX 7900 XTX.
TWO_CARDS = """ggml_cuda_init: found 2 ROCm devices (Total VRAM: 221152 MiB):
  Device 0: AMD Instinct MI300X, gfx942:sramecc+:xnack- (0x942), VMM: no, Wave Size: 64, \
VRAM: 196592 MiB
  Device 1: AMD Radeon RX 7900 XTX, gfx1100 (0x1100), VMM: no, Wave Size: 32, VRAM: 24560 MiB
Available devices:
  ROCm0: AMD Instinct MI300X (196592 MiB, 196282 MiB free)
  ROCm1: AMD Radeon RX 7900 XTX (24560 MiB, 24000 MiB free)
"""
#: A CUDA build's init lines name compute capabilities, no gfx target.
CUDA_CARD = "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, VRAM: 143156 MiB\n"
#: The reduced ROCm image's targets, as ``harness build --backend rocm --reduced`` plans them.
REDUCED = build_targets(BuildRequest(backend=Backend.ROCM, reduced=True).cmake_flags())


def test_the_captured_listing_names_each_card_and_its_target() -> None:
    (card,) = parse_rocm_devices((LOGS / "used.log").read_text())
    assert card == RocmDevice(0, "AMD Instinct MI300X", "gfx942", ("sramecc+", "xnack-"))
    assert card.target == "gfx942:sramecc+:xnack-"
    assert parse_rocm_devices(TWO_CARDS)[1].arch == "gfx1100"
    assert parse_rocm_devices(CUDA_CARD) == ()


def test_the_build_targets_come_from_its_recorded_flags() -> None:
    assert REDUCED == ("gfx1100",)
    assert build_targets(["-DGGML_HIP=ON", "-DGPU_TARGETS=gfx942;gfx1100"]) == ("gfx942",
                                                                               "gfx1100")
    assert build_targets(["-DAMDGPU_TARGETS:STRING=gfx90a:xnack-"]) == ("gfx90a:xnack-",)
    assert build_targets(["-DGGML_HIP=ON"]) == ()


@pytest.mark.parametrize(("target", "device", "runs"), [
    ("gfx942", RocmDevice(0, "MI300X", "gfx942", ("sramecc+", "xnack-")), True),
    ("gfx1100", RocmDevice(0, "MI300X", "gfx942", ("sramecc+", "xnack-")), False),
    ("gfx9-4-generic", RocmDevice(0, "MI300X", "gfx942", ("sramecc+", "xnack-")), True),
    ("gfx11-generic", RocmDevice(0, "RX 7800 XT", "gfx1101"), True),
    ("gfx11-generic", RocmDevice(0, "MI300X", "gfx942"), False),
    ("gfx90a:xnack-", RocmDevice(0, "MI210", "gfx90a", ("sramecc+", "xnack-")), True),
    ("gfx90a:xnack+", RocmDevice(0, "MI210", "gfx90a", ("sramecc+", "xnack-")), False),
])
def test_code_runs_on_its_processor_its_generic_family_and_matching_features(
        target: str, device: RocmDevice, runs: bool) -> None:
    assert runs_on(target, device) is runs


def test_a_card_the_build_has_no_code_for_is_hidden_and_the_rest_keep_their_order() -> None:
    env = plan_rocm_env(REDUCED, parse_rocm_devices(TWO_CARDS), inherited={})
    assert dict(env.environment) == {VISIBILITY_VARIABLE: "1"}
    assert [d.index for d in env.visible] == [1]
    assert [d.index for d in env.hidden] == [0]
    assert not env.all_hidden
    assert "device 0 (AMD Instinct MI300X, gfx942:sramecc+:xnack-)" in env.describe()
    assert env.describe().startswith("ROCR_VISIBLE_DEVICES=1: hidden on purpose")


def test_a_host_with_no_card_the_build_can_run_on_hides_them_all() -> None:
    (mi300x,) = parse_rocm_devices((LOGS / "used.log").read_text())
    env = plan_rocm_env(REDUCED, (mi300x,), inherited={})
    assert dict(env.environment) == {VISIBILITY_VARIABLE: NONE_VISIBLE}
    assert env.all_hidden
    assert "the build has code for gfx1100 only" in env.reason


def test_nothing_is_hidden_when_every_card_has_code_or_the_targets_are_unknown() -> None:
    cards = parse_rocm_devices(TWO_CARDS)
    every = plan_rocm_env(("gfx942", "gfx1100"), cards, inherited={})
    assert dict(every.environment) == {}
    assert every.visible == cards
    unknown = plan_rocm_env((), cards, inherited={})
    assert dict(unknown.environment) == {}
    assert "not recorded" in unknown.reason


@pytest.mark.parametrize("variable", ["ROCR_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"])
def test_a_device_choice_the_user_made_is_not_planned_over(variable: str) -> None:
    env = plan_rocm_env(REDUCED, parse_rocm_devices(TWO_CARDS), inherited={variable: "0"})
    assert dict(env.environment) == {}
    assert f"{variable}=0" in env.reason


def test_the_builds_own_kernel_packs_are_routed_unless_the_user_routed_them() -> None:
    cards = parse_rocm_devices(TWO_CARDS)
    env = plan_rocm_env(("gfx942", "gfx1100"), cards, inherited={}, kernel_packs="/b/rocblas")
    assert dict(env.environment) == {KERNEL_PACKS_VARIABLE: "/b/rocblas"}
    kept = plan_rocm_env(("gfx942", "gfx1100"), cards,
                         inherited={KERNEL_PACKS_VARIABLE: "/mine"}, kernel_packs="/b/rocblas")
    assert dict(kept.environment) == {}


def test_the_plan_carries_the_environment_and_says_why() -> None:
    model = modelgen.ensure_fixtures().model("dense")
    env = plan_rocm_env(REDUCED, parse_rocm_devices(TWO_CARDS), inherited={})
    plan = plan_launch(PlanRequest(model_path=model, model=read_model_facts(model),
                                   launch_env=env))
    assert dict(plan.environment) == {VISIBILITY_VARIABLE: "1"}
    assert plan.to_json()["environment"] == {VISIBILITY_VARIABLE: "1"}
    assert any(r.startswith("ROCm launch environment: ROCR_VISIBLE_DEVICES=1") for r in
               plan.reasons)
    plain = plan_launch(PlanRequest(model_path=model, model=read_model_facts(model)))
    assert dict(plain.environment) == {}


def test_a_launch_that_hid_every_card_is_told_from_a_failed_init() -> None:
    log = (LOGS / "captured-no-kfd.log").read_text()
    (mi300x,) = parse_rocm_devices((LOGS / "used.log").read_text())
    hidden = plan_rocm_env(REDUCED, (mi300x,), inherited={})
    verdict = gpu_verdict(log, "rocm", launch_env=hidden)
    assert {b.state for b in verdict.blocks} == {GpuState.HIDDEN}, verdict.reason
    assert "ROCR_VISIBLE_DEVICES=-1" in verdict.reason
    assert not verdict.passed
    unplanned = gpu_verdict(log, "rocm")
    assert {b.state for b in unplanned.blocks} == {GpuState.INIT_FAILED}


def test_a_used_card_beside_a_hidden_one_names_both() -> None:
    env = RocmLaunchEnv(hidden=(RocmDevice(1, "AMD Radeon RX 7900 XTX", "gfx1100"),),
                        visible=(RocmDevice(0, "AMD Instinct MI300X", "gfx942"),),
                        environment={VISIBILITY_VARIABLE: "0"}, reason="hidden on purpose")
    verdict = gpu_verdict((LOGS / "used.log").read_text(), "rocm", launch_env=env)
    assert verdict.passed, verdict.reason
    assert "ROCR_VISIBLE_DEVICES=0: hidden on purpose" in verdict.reason


def _stand_in_rocm_build(tmp_path: Path) -> Path:
    """A stand-in for a ROCm llama-server's ``--list-devices`` (the harness's control flow
    only): the two cards, or only those ``ROCR_VISIBLE_DEVICES`` leaves, renumbered as
    ROCr does."""
    script = tmp_path / "llama-server"
    script.write_text(f"""#!/usr/bin/env python3
import os, sys
lines = {TWO_CARDS.splitlines()!r}
cards = [(lines[1], lines[4]), (lines[2], lines[5])]
chosen = os.environ.get("ROCR_VISIBLE_DEVICES")
if chosen is not None:
    cards = [cards[int(i)] for i in chosen.split(",") if i.isdigit() and int(i) < 2]
for n, (init, listed) in enumerate(cards):
    sys.stderr.write(init.replace(init.split(":")[0], f"  Device {{n}}") + "\\n")
print("Available devices:")
for n, (init, listed) in enumerate(cards):
    print(listed.replace(listed.split(":")[0], f"  ROCm{{n}}"))
""")
    script.chmod(0o755)
    return script


def test_the_probe_plans_the_environment_and_the_planner_reads_what_it_leaves(
        tmp_path: Path) -> None:
    binary = _stand_in_rocm_build(tmp_path)
    info = dataclasses.replace(bare_binary_info(binary=str(binary), sha256="0" * 64,
                                                backend=Backend.ROCM, version="",
                                                help_text=""),
                               cmake_flags=("-DGGML_HIP=ON", "-DGPU_TARGETS=gfx1100"))
    build = BuildUnderTest(binary=binary, info=info)
    env = plan_launch_env(build, None)
    assert env is not None
    assert dict(env.environment) == {VISIBILITY_VARIABLE: "1"}
    seen = devices_seen(build, None, env.environment)
    assert [(d.name, d.description) for d in seen] == [("ROCm0", "AMD Radeon RX 7900 XTX")]
    assert len(devices_seen(build, None, {})) == 2
