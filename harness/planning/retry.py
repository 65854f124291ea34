"""The launch a retry makes: the same spec without its drafter, or on a safer rung (pure).

``without_drafter`` is reference 002's retry (docs/references.md) after a drafter broke
the start: everything else about the launch stays. ``apply_rung`` turns an offload-ladder
rung (``ladder.py``) into the ``LaunchSpec`` fields llama-server reads, clearing whatever
the previous offload kind had set so two kinds never mix in one argv. ``starting_rung`` is
the ladder's top for a launch as it will really start: the plan's offload, else what the
spec itself pins.
"""

from __future__ import annotations

from dataclasses import replace

from harness.facts.model_facts import ModelFacts
from harness.planning.ladder import Rung, first_rung
from harness.planning.launch import LaunchSpec
from harness.planning.offload import OffloadKind, OffloadPlan

#: Offload and KV-placement flags (common/arg.cpp of the pinned source, every alias),
#: removed from ``extra_args`` when a rung sets those fields itself.
_OFFLOAD_VALUE_FLAGS = frozenset({"-ngl", "--gpu-layers", "--n-gpu-layers",
                                  "-ncmoe", "--n-cpu-moe", "-ncffn", "--n-cpu-ffn"})
_OFFLOAD_SWITCHES = frozenset({"-cmoe", "--cpu-moe", "-kvo", "--kv-offload",
                               "-nkvo", "--no-kv-offload"})


def without_drafter(spec: LaunchSpec) -> LaunchSpec:
    """The launch with no speculative decoding: no spec type, drafter or draft bounds."""
    return replace(spec, spec_type=None, drafter=None, spec_draft_n_min=None,
                   spec_draft_n_max=None, spec_draft_p_min=None, spec_draft_sampling=None)


def apply_rung(spec: LaunchSpec, rung: Rung) -> LaunchSpec:
    """``spec`` placed on ``rung``: its offload kind, ``-ngl``, KV placement and context.

    A rung's ``ctx_size`` of None keeps the spec's context; a rung that keeps the KV cache
    on the GPU keeps an explicit ``--kv-offload`` and otherwise leaves it to the server.
    """
    return replace(
        spec,
        n_cpu_moe=rung.n if rung.kind is OffloadKind.N_CPU_MOE else None,
        cpu_moe=rung.kind is OffloadKind.CPU_MOE,
        n_cpu_ffn=rung.n if rung.kind is OffloadKind.N_CPU_FFN else None,
        n_gpu_layers=rung.gpu_layers,
        kv_offload=(spec.kv_offload or None) if rung.kv_offload else False,
        ctx_size=rung.ctx_size if rung.ctx_size is not None else spec.ctx_size,
        extra_args=_drop_offload_args(spec.extra_args),
    )


def starting_rung(model: ModelFacts, offload: OffloadPlan | None, spec: LaunchSpec) -> Rung:
    """The rung ``spec`` starts on: ``apply_rung(spec, starting_rung(…))`` is ``spec`` again
    (offload flags in ``extra_args`` aside; a rung sets those as fields).

    Without an offload plan (no GPU was planned for) the spec's own flags stand in for it.
    ``-ngl`` and the KV placement are always the spec's: a plan that leaves the layer
    count to the engine still carries a card's ``-ngl`` in its spec, and the ladder must
    know what the launch really pins to take the ``layers_to_engine`` step.
    """
    plan = offload if offload is not None else _plan_from_spec(spec)
    rung = replace(first_rung(model, plan, spec.ctx_size), gpu_layers=spec.n_gpu_layers,
                   kv_offload=spec.kv_offload is not False)
    return replace(rung, label=f"as planned: {' '.join(rung.flags) or 'no offload flags'}")


def _plan_from_spec(spec: LaunchSpec) -> OffloadPlan:
    if spec.n_cpu_moe is not None:
        kind, n = OffloadKind.N_CPU_MOE, spec.n_cpu_moe
    elif spec.cpu_moe:
        kind, n = OffloadKind.CPU_MOE, None
    elif spec.n_cpu_ffn is not None:
        kind, n = OffloadKind.N_CPU_FFN, spec.n_cpu_ffn
    else:
        kind, n = OffloadKind.NONE, None
    return OffloadPlan(kind, n, spec.n_gpu_layers, n or 0, None, None, 0, False,
                       "no offload planned: the launch's own flags")


def _drop_offload_args(args: tuple[str, ...]) -> tuple[str, ...]:
    kept: list[str] = []
    skip_value = False
    for arg in args:
        if skip_value:
            skip_value = False
        elif arg in _OFFLOAD_VALUE_FLAGS:
            skip_value = True
        elif arg not in _OFFLOAD_SWITCHES:
            kept.append(arg)
    return tuple(kept)
