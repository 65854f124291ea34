"""The degrade ladders: one step safer per out-of-memory start, MoE and dense (pure).

Ported from reference 003's degrade functions (docs/references.md), which trade speed for
admission one step per GPU OOM at startup and then report that nothing safer is left:

- MoE: ``--n-cpu-moe N`` (``-ngl`` pinned) → ``--cpu-moe`` (pinned) → ``--cpu-moe`` with
  the layer count left to llama-server's fit. Dropping ``--cpu-moe`` would put experts
  back on the GPU, which cannot help an OOM. A MoE launch that planned no offload (it
  fitted, or there was no GPU to plan for) steps straight to ``--cpu-moe`` unpinned.
- dense: ``--n-cpu-ffn N`` (pinned) → ``--n-cpu-ffn <every block>`` (pinned) → the same
  with the layer count left to llama-server. A dense launch without a FFN split has no
  offload rung (reference 003 plans no estimate-only dense split).

After the offload rungs come two of ours, for OOMs the weights are not to blame:
``--no-kv-offload`` (the KV cache in system RAM; docs/design.md names it the rung for a real
KV-buffer OOM), then halving an explicitly launched context down to a floor. A context
the launch left to the server is not shrunk: an explicit ``-c`` would switch off the
server's own ``--fit`` of the context and could ask for more than it had chosen.

A rung never asks for a switch the build lacks: the plan's ``unavailable`` kinds ride on
every rung, so a MoE launch on a build without ``--cpu-moe`` goes from its plan straight
to the layer count (a plan itself avoids them, ``offload.py``).

Every step is strictly safer on ``Safety``'s componentwise order, and each component
can only move a bounded number of times, so every ladder is finite.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from harness.facts.model_facts import ModelFacts
from harness.planning.offload import OffloadKind, OffloadPlan, offload_flags

#: The smallest context the context rung halves down to (ours: below a couple of thousand
#: tokens a chat server stops being useful, so the ladder ends there instead).
DEFAULT_MIN_CTX_SIZE = 2048
NO_KV_OFFLOAD = "--no-kv-offload"


class Step(Enum):
    """How a rung differs from the one before it.

    ``planned`` is the offload plan itself; ``all_experts_to_cpu``, ``all_ffn_to_cpu`` and
    ``layers_to_engine`` are reference 003's degrade steps; ``kv_to_cpu`` and
    ``smaller_context`` are this harness's, after them.
    """

    PLANNED = "planned"
    ALL_EXPERTS_TO_CPU = "all_experts_to_cpu"
    ALL_FFN_TO_CPU = "all_ffn_to_cpu"
    LAYERS_TO_ENGINE = "layers_to_engine"
    KV_TO_CPU = "kv_to_cpu"
    SMALLER_CONTEXT = "smaller_context"


@dataclass(frozen=True)
class Safety:
    """A rung's position on the ladder's partial order: each field only grows safer."""

    #: (0 nothing / 1 the first ``blocks`` / 2 every expert, ``blocks``) in system RAM.
    weights_in_ram: tuple[int, int]
    layers_left_to_engine: bool
    kv_in_ram: bool
    #: The context launched with; None is the launch's own (never compared to a number,
    #: since a ladder only sets a context where the launch had one).
    ctx_size: int | None

    def at_least_as_safe_as(self, other: Safety) -> bool:
        return (self.weights_in_ram >= other.weights_in_ram
                and self.layers_left_to_engine >= other.layers_left_to_engine
                and self.kv_in_ram >= other.kv_in_ram
                and _ctx_at_most(self.ctx_size, other.ctx_size))

    def strictly_safer_than(self, other: Safety) -> bool:
        return self != other and self.at_least_as_safe_as(other)


def _ctx_at_most(mine: int | None, other: int | None) -> bool:
    if other is None:
        return True
    return mine is not None and mine <= other


@dataclass(frozen=True)
class Rung:
    """One launch configuration on a ladder: its flags, a label and why it is tried."""

    step: Step
    label: str
    reason: str
    kind: OffloadKind
    #: The N of ``--n-cpu-moe N`` / ``--n-cpu-ffn N``.
    n: int | None
    #: ``-ngl`` pinned to this many layers; None leaves the count to llama-server.
    gpu_layers: int | None
    kv_offload: bool
    #: The launch's ``-c``; None leaves it as the launch had it.
    ctx_size: int | None
    moe: bool
    block_count: int
    #: Offload kinds whose switch the build lacks: no rung takes them.
    unavailable: frozenset[OffloadKind] = frozenset()

    @property
    def flags(self) -> tuple[str, ...]:
        """Offload and KV flags for llama-server (the context is ``ctx_size``, not a flag)."""
        kv = () if self.kv_offload else (NO_KV_OFFLOAD,)
        return offload_flags(self.kind, self.n, self.gpu_layers) + kv

    @property
    def safety(self) -> Safety:
        return Safety(_weights_in_ram(self), self.gpu_layers is None, not self.kv_offload,
                      self.ctx_size)


def _weights_in_ram(rung: Rung) -> tuple[int, int]:
    if rung.kind is OffloadKind.CPU_MOE:
        return (2, rung.block_count)
    if rung.kind in (OffloadKind.N_CPU_MOE, OffloadKind.N_CPU_FFN) and rung.n is not None:
        return (1, min(rung.n, rung.block_count))
    return (0, 0)


def first_rung(model: ModelFacts, plan: OffloadPlan, ctx_size: int | None = None) -> Rung:
    """The ladder's top: the launch as planned, with ``ctx_size`` as launched (or None)."""
    flags = " ".join(plan.flags) or "no offload flags"
    return Rung(Step.PLANNED, f"as planned: {flags}", plan.reason, plan.kind, plan.n,
                plan.gpu_layers, True, ctx_size, model.is_moe, model.block_count,
                plan.unavailable)


def next_rung(current: Rung, min_ctx_size: int = DEFAULT_MIN_CTX_SIZE) -> Rung | None:
    """The next safer rung after an out-of-memory start on ``current``; None at the end.

    ``end_reason`` says why nothing safer is left.
    """
    step = _advance(current, min_ctx_size)
    return step if isinstance(step, Rung) else None


def end_reason(current: Rung, min_ctx_size: int = DEFAULT_MIN_CTX_SIZE) -> str | None:
    """Why ``current`` is the last rung ("nothing safer left: …"); None if it is not."""
    step = _advance(current, min_ctx_size)
    return step if isinstance(step, str) else None


def ladder_for(model: ModelFacts, plan: OffloadPlan, ctx_size: int | None = None,
               min_ctx_size: int = DEFAULT_MIN_CTX_SIZE) -> tuple[Rung, ...]:
    """Every rung from the plan down to the last one, in the order an OOM retry takes them."""
    rungs = [first_rung(model, plan, ctx_size)]
    while (following := next_rung(rungs[-1], min_ctx_size)) is not None:
        rungs.append(following)
    return tuple(rungs)


def _advance(current: Rung, min_ctx_size: int) -> Rung | str:
    """The next rung, or the reason there is none."""
    if min_ctx_size < 1:
        raise ValueError(f"min_ctx_size must be at least 1, got {min_ctx_size}")
    oom = "GPU out of memory at start"
    if (current.moe and current.kind is not OffloadKind.CPU_MOE
            and OffloadKind.CPU_MOE not in current.unavailable):
        # Reference 003 goes from a partial split straight to every expert; from no split
        # the pin is not added, so the step is safer on every count.
        return replace(current, step=Step.ALL_EXPERTS_TO_CPU, kind=OffloadKind.CPU_MOE,
                       n=None, label="every expert to system RAM (--cpu-moe)",
                       reason=f"{oom} — retrying with all experts in system RAM")
    if (not current.moe and current.kind is OffloadKind.N_CPU_FFN and current.n is not None
            and current.n < current.block_count):
        blocks = current.block_count
        return replace(current, step=Step.ALL_FFN_TO_CPU, n=blocks,
                       label=f"every block's dense FFN to system RAM (--n-cpu-ffn {blocks})",
                       reason=f"{oom} — retrying with every dense FFN layer in system RAM")
    if current.gpu_layers is not None:
        return replace(current, step=Step.LAYERS_TO_ENGINE, gpu_layers=None,
                       label=f"GPU layer count left to llama-server (no -ngl "
                             f"{current.gpu_layers})",
                       reason=f"{oom} — keeping the offload and letting llama-server's fit "
                              "drop whole layers to the CPU")
    if current.kv_offload:
        return replace(current, step=Step.KV_TO_CPU, kv_offload=False,
                       label=f"KV cache in system RAM ({NO_KV_OFFLOAD})",
                       reason=f"{oom} with the weights already retreated — retrying with "
                              "the KV cache in system RAM")
    if current.ctx_size is not None and current.ctx_size // 2 >= min_ctx_size:
        smaller = current.ctx_size // 2
        return replace(current, step=Step.SMALLER_CONTEXT, ctx_size=smaller,
                       label=f"context {current.ctx_size} → {smaller}",
                       reason=f"{oom} with weights and KV cache in retreat — retrying "
                              f"with half the context ({smaller} tokens)")
    return _nothing_safer(current, min_ctx_size)


def _nothing_safer(current: Rung, min_ctx_size: int) -> str:
    if current.moe and OffloadKind.CPU_MOE in current.unavailable:
        what = "the build has no --cpu-moe to move the experts to system RAM"
    elif current.moe:
        what = ("every expert is in system RAM (dropping --cpu-moe would put them back on the "
                "GPU)")
    elif current.kind is OffloadKind.N_CPU_FFN:
        what = "every block's dense FFN is in system RAM"
    else:
        what = "there is no dense FFN split to widen"
    if current.ctx_size is None:
        ctx = "the context was left to the server, so the ladder does not set one"
    else:
        ctx = (f"the context {current.ctx_size} cannot halve without going under "
               f"{min_ctx_size}")
    return (f"nothing safer left: {what}, the layer count is llama-server's, the KV cache "
            f"is in system RAM and {ctx}")
