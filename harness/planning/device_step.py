"""The launch planner's device steps (pure): the memory the offload planner may fill, and
the spread over a device list written into the launch's settings and flags. References
003 and 004 are described in docs/references.md."""

from __future__ import annotations

from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

from harness.facts.device_list import DeviceList
from harness.facts.gpu import GpuConfig, GpuInfo, ServerSettings, SplitMode
from harness.facts.model_facts import ModelFacts
from harness.planning.autotune import Origin
from harness.planning.kv import KvPlan
from harness.planning.multi_device import COMPUTE_BYTES_PER_CTX_TOKEN, DevicePlan, plan_devices
from harness.planning.offload import COMPUTE_RESERVE_BYTES, DEFAULT_MARGIN_BYTES, OffloadPlan
from harness.planning.planned_share import Offload

#: The origin of the fields a device list sets.
DEVICES = "devices"
#: Origins that say the user asked for the value: the device plan leaves those alone.
_ASKED = frozenset({Origin.CALL.value, Origin.ENV.value})


@dataclass(frozen=True)
class DeviceBudget:
    """What the offload planner may fill, and what it keeps free beside the weights."""

    bytes: int
    compute_reserve_bytes: int
    margin_bytes: int


def device_budget(gpu: GpuInfo | None, config: GpuConfig | None,
                  devices: DeviceList | None, context: int) -> DeviceBudget | None:
    """One GPU: its memory less the card's headroom, with reference 003's flat compute
    reserve and margin. A device list: every device's budget (its headroom already taken
    off) and reference 004's compute estimate for ``context`` tokens, no further margin.
    None: no device, nothing to offload."""
    if devices is not None:
        return DeviceBudget(sum(d.budget_bytes for d in devices.devices),
                            int(context * COMPUTE_BYTES_PER_CTX_TOKEN), 0)
    if gpu is None:
        return None
    headroom = config.reserved_headroom_mib if config else 0
    return DeviceBudget((gpu.vram_mib - headroom) << 20, COMPUTE_RESERVE_BYTES,
                        DEFAULT_MARGIN_BYTES)


def plan_device_step(model: ModelFacts, devices: DeviceList | None,
                     offload: OffloadPlan | None, kv: KvPlan | None, *,
                     settings: ServerSettings, origins: MutableMapping[str, str],
                     launch: MutableMapping[str, Any],
                     reasons: list[str]) -> tuple[DevicePlan | None, ServerSettings]:
    """Spread ``model`` over ``devices`` under the offload plan's layer count and host
    overrides; ``-ngl``, ``--split-mode``, ``--main-gpu``, ``--tensor-split`` and ``--rpc``
    go into ``settings`` and ``launch`` (a value the user asked for stays), the plan's
    reasons into ``reasons``. No devices: nothing changes."""
    if devices is None:
        return None, settings
    asked_ngl = settings.n_gpu_layers if origins.get("n_gpu_layers") in _ASKED else None
    if asked_ngl is not None and asked_ngl >= 0:
        layers = asked_ngl
    elif offload is not None and offload.gpu_layers is not None:
        layers = offload.gpu_layers
    else:
        layers = model.block_count + 1
    kv_on_devices = kv is not None and kv.valid and settings.kv_offload is not False
    context = kv.n_ctx if kv is not None and kv.valid else (settings.ctx_size
                                                            or model.context_length)
    plan = plan_devices(model, devices, Offload(
        n_gpu_layers=layers, n_cpu_moe=launch.get("n_cpu_moe"),
        cpu_moe=bool(launch.get("cpu_moe")), n_cpu_ffn=launch.get("n_cpu_ffn")),
        kv_bytes=kv.total_bytes if kv_on_devices and kv is not None else 0, context=context)
    chosen: dict[str, Any] = {"n_gpu_layers": plan.n_gpu_layers,
                              "split_mode": SplitMode(plan.split_mode),
                              "main_gpu": plan.main_gpu}
    overlay = {name: value for name, value in chosen.items()
               if value is not None and origins.get(name) not in _ASKED}
    settings = settings.overlaid(ServerSettings(**overlay))
    origins.update(dict.fromkeys(overlay, DEVICES))
    launch["tensor_split"] = plan.tensor_split_arg
    origins["tensor_split"] = DEVICES
    if plan.rpc_arg:
        launch["rpc"] = plan.rpc_arg
        origins["rpc"] = DEVICES
    if plan.device_arg:
        launch["device"] = plan.device_arg
        origins["device"] = DEVICES
    reasons.extend(plan.reasons)
    return plan, settings
