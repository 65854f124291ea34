"""The launch supervisor's per-device rung: after a spread's out-of-memory start, move units
off the device that could not allocate its share (pure).

Reference 003 (docs/references.md) steps one rung safer per out-of-memory start. Over a
device list the first step is narrower than any offload rung: the device the server
named gets less memory in the plan (``multi_device.step_down``), the spread is planned
again from the same inputs, and the next start sends the new ``--tensor-split``. Only when
no device is named, or nothing can move (it holds no units, the others cannot take them),
does the supervisor step down the offload ladder as it would on one device.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from harness.facts.model_facts import ModelFacts
from harness.planning.launch import LaunchSpec
from harness.planning.multi_device import DevicePlan, moved_off
from harness.verdicts.device_oom import failed_device_index


@dataclass(frozen=True)
class DeviceRetreat:
    """The next start of a spread, and what changed, in words."""

    spec: LaunchSpec
    plan: DevicePlan
    action: str


def device_retreat(model: ModelFacts, spec: LaunchSpec, plan: DevicePlan,
                   server_log: str) -> DeviceRetreat | None:
    """The start after ``server_log``'s out-of-memory start of ``spec`` (spread as ``plan``),
    with units moved off the device that failed; None when the log names no device of the
    plan or nothing can move off it."""
    index = failed_device_index(server_log, plan.devices)
    if index is None:
        return None
    following = moved_off(model, plan, index)
    if following is None:
        return None
    share = plan.shares[index]
    return DeviceRetreat(
        dataclasses.replace(spec, tensor_split=following.tensor_split_arg), following,
        f"moved units off {share.device.key}, which could not allocate its share "
        f"({share.layer_range()}): --tensor-split {plan.tensor_split_arg} → "
        f"{following.tensor_split_arg} (now {following.shares[index].layer_range()} there)")
