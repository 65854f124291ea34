"""The launch fields and warning of an offload plan (pure): the switches its kind sets,
and the not-supported warning when it took another kind than it wanted."""

from __future__ import annotations

from typing import Any

from harness.planning.capability import NOT_SUPPORTED_CODE, PlanWarning
from harness.planning.offload import OVERRIDE_FLAGS, OffloadKind, OffloadPlan


def offload_substitute(plan: OffloadPlan) -> PlanWarning:
    """The warning of an offload plan that took another kind than it wanted."""
    assert plan.wanted is not None
    used = OVERRIDE_FLAGS.get(plan.kind, plan.kind.value)
    if plan.gpu_layers is not None and plan.kind is OffloadKind.LAYER_SPLIT:
        used = f"--n-gpu-layers {plan.gpu_layers}"
    return PlanWarning(NOT_SUPPORTED_CODE, plan.wanted.value, OVERRIDE_FLAGS[plan.wanted],
                       used, plan.reason)


def offload_switches(plan: OffloadPlan) -> dict[str, Any]:
    """The LaunchSpec fields for the plan's kind (``-ngl`` is a tuned setting, set apart)."""
    if plan.kind is OffloadKind.N_CPU_MOE:
        return {"n_cpu_moe": plan.n}
    if plan.kind is OffloadKind.CPU_MOE:
        return {"cpu_moe": True}
    if plan.kind is OffloadKind.N_CPU_FFN:
        return {"n_cpu_ffn": plan.n}
    return {}
