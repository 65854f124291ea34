"""A planned launch held against the launch the startup log reports (pure).

``compare_launch`` checks a planned launch against a ``launch_report.LaunchReport``,
applying the request the way llama_context does (``n_ctx`` padded to 256, ``n_batch``
capped by ``n_ctx``…), and returns every field that differs as a ``Mismatch``. This module
holds the checks of the context, the batches, flash attention and speculation;
``placement_checks`` holds those of where the weights and KV cache went. Which planned
fields a build cannot show at all is ``unverifiable_fields``' job.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from pathlib import PurePath

from harness.verdicts.block_report import FlashAttnMode
from harness.verdicts.field_check import Comparer, FieldCheck, int_field
from harness.verdicts.launch_report import LaunchReport
from harness.verdicts.placement_checks import PLACEMENT_COMPARERS

#: llama_context pads the context to this many cells (src/llama-context.cpp, GGML_PAD).
CTX_PAD = 256


@dataclass(frozen=True)
class Mismatch:
    """A planned field the server did not end up with."""

    field: str
    planned: object
    observed: object
    #: What the server makes of the planned value, when that is not the value itself.
    detail: str = ""

    def __str__(self) -> str:
        note = f" ({self.detail})" if self.detail else ""
        return f"{self.field}: planned {self.planned!r}, observed {self.observed!r}{note}"


def compare_launch(expected: Mapping[str, object], report: LaunchReport) -> tuple[Mismatch, ...]:
    """Every planned field the log contradicts; ``()`` when the plan reached the server intact.

    Keys are ``LaunchSpec`` names (``ctx_size``, ``parallel``, ``batch_size``,
    ``ubatch_size``, ``cache_type_k``, ``cache_type_v``, ``flash_attn``, ``n_gpu_layers``,
    ``split_mode``, ``main_gpu``, ``kv_offload``, ``load_mode``, ``ctx_checkpoints``,
    ``checkpoint_min_step``, ``spec_draft_n_min``, ``spec_draft_n_max``,
    ``spec_draft_p_min``, ``spec_draft_sampling``, ``drafter``, ``spec_type``,
    ``n_cpu_moe``, ``cpu_moe``, ``n_cpu_ffn``) or report names
    (``n_ctx``, ``n_ctx_seq``, ``n_batch``, ``n_ubatch``, ``n_slots``, ``type_k``,
    ``type_v``, ``flash_attn_effective``, ``drafter_loaded``, ``mtp_context``,
    ``speculative_ready``, ``overrides``, ``lazy_tensors``: the planned tuple of names).
    A None value (and ``cpu_moe`` False, LaunchSpec's default) is not planned and is
    skipped. A field the log cannot show counts as a
    mismatch (observed None, with why); leave such fields out with
    ``unverifiable_fields.unverifiable`` first.
    Raises ValueError for an unknown key.
    """
    unknown = sorted(set(expected) - set(_COMPARERS))
    if unknown:
        raise ValueError(f"compare_launch: unknown field(s) {', '.join(unknown)}; "
                         f"known: {', '.join(sorted(_COMPARERS))}")
    found: list[Mismatch] = []
    for key, planned in expected.items():
        if planned is None:
            continue
        check = _COMPARERS[key](planned, report)
        if not check.matches:
            found.append(Mismatch(key, planned, check.observed, check.detail))
    return tuple(found)


def _pad(n: int) -> int:
    return -(-n // CTX_PAD) * CTX_PAD


def applied_n_ctx(ctx_size: int, n_seq_max: int, kv_unified: bool) -> int:
    """``n_ctx`` as llama_context makes it from ``-c``: padded to 256, and with one stream per
    sequence, split into padded per-sequence windows and multiplied back."""
    n_ctx = _pad(ctx_size)
    if kv_unified:
        return n_ctx
    return _pad(n_ctx // n_seq_max) * n_seq_max


def _ctx_size(value: object, report: LaunchReport) -> FieldCheck:
    ctx = int_field(value, "ctx_size")
    target = report.target
    if ctx == 0 or target is None or target.n_seq_max is None or target.kv_unified is None:
        # 0 asks the server for the model's own length: nothing planned to compare.
        return FieldCheck(ctx if ctx else None, report.n_ctx if ctx else None)
    want = applied_n_ctx(ctx, target.n_seq_max, target.kv_unified)
    detail = "" if want == ctx else f"the server makes it n_ctx {want}"
    return FieldCheck(want, report.n_ctx, detail)


def _batch_size(value: object, report: LaunchReport) -> FieldCheck:
    batch = int_field(value, "batch_size")
    if report.n_ctx is None:
        return FieldCheck(batch, None)
    # Causal attention caps the logical batch at the context (llama_context).
    want = min(batch, report.n_ctx)
    return FieldCheck(want, report.n_batch, "" if want == batch else f"capped to n_ctx {want}")


def _ubatch_size(value: object, report: LaunchReport) -> FieldCheck:
    ubatch = int_field(value, "ubatch_size")
    if report.n_batch is None:
        return FieldCheck(ubatch, None)
    want = min(ubatch, report.n_batch)
    detail = "" if want == ubatch else f"capped to n_batch {want}"
    return FieldCheck(want, report.n_ubatch, detail)


def _flash_attn(value: object, report: LaunchReport) -> FieldCheck:
    words = {FlashAttnMode.ENABLED: "on", FlashAttnMode.DISABLED: "off", FlashAttnMode.AUTO: "auto"}
    mode = report.flash_attn_mode
    observed = words[mode] if mode else None
    forced = report.target is not None and report.target.flash_attn_forced is not None
    if forced and mode is FlashAttnMode.ENABLED:
        # llama_init_from_model turned the requested auto into enabled and said why.
        observed = "auto"
    return FieldCheck(str(getattr(value, "value", value)), observed)


def _drafter(value: object, report: LaunchReport) -> FieldCheck:
    path = str(value)
    observed = report.drafter_path if report.drafter_loaded else None
    return FieldCheck(_norm_path(path), _norm_path(observed) if observed else None)


def _norm_path(path: str) -> str:
    return str(PurePath(path))


def _spec_type(value: object, report: LaunchReport) -> FieldCheck:
    return FieldCheck(str(value), ",".join(report.speculative_types) or None)


def _field(name: str) -> Comparer:
    def check(value: object, report: LaunchReport) -> FieldCheck:
        return FieldCheck(value, getattr(report, name))
    return check


def _mtp_context(value: object, report: LaunchReport) -> FieldCheck:
    return FieldCheck(value, report.mtp_context_created)


def _override_count(value: object, report: LaunchReport) -> FieldCheck:
    return FieldCheck(value, len(report.overrides))


_NO_DRAFT_PARAMS = ("no '- n_max=…, n_min=…, p_min=…' line: no draft implementation was set up "
                    "(common/speculative.cpp prints one per draft-* implementation)")


def _draft_value(report: LaunchReport, name: str) -> object:
    """One draft parameter as every draft implementation printed it; a tuple if they differ."""
    values = sorted({getattr(params, name) for params in report.draft_params})
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def _draft_count(key: str, name: str) -> Comparer:
    def check(value: object, report: LaunchReport) -> FieldCheck:
        observed = _draft_value(report, name)
        detail = "" if report.draft_params else _NO_DRAFT_PARAMS
        return FieldCheck(int_field(value, key), observed, detail)
    return check


def _as_float32(value: float) -> float:
    """``value`` as common/arg.cpp stores it (``std::stof`` into a float)."""
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _spec_draft_p_min(value: object, report: LaunchReport) -> FieldCheck:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"compare_launch: spec_draft_p_min must be a number, got {value!r}")
    printed = _draft_value(report, "p_min")
    if not isinstance(printed, Decimal):
        return FieldCheck(value, printed, "" if report.draft_params else _NO_DRAFT_PARAMS)
    # The line rounds to its own decimals (%f or %.2f), so the plan is compared at that
    # precision: 0.125 is printed 0.12 by draft-mtp, as printf rounds the stored float.
    decimals = -int(printed.as_tuple().exponent)
    want = f"{_as_float32(float(value)):.{decimals}f}"
    return FieldCheck(value, float(printed), f"printed with {decimals} decimals as {printed}",
                      ok=want == str(printed))


def _checkpoint_min_step(value: object, report: LaunchReport) -> FieldCheck:
    step = int_field(value, "checkpoint_min_step")
    detail = ("context checkpoints disabled: load_model prints no spacing"
              if report.ctx_checkpoints == 0 else "")
    return FieldCheck(step, report.checkpoint_min_step, detail)


def _spec_draft_sampling(value: object, report: LaunchReport) -> FieldCheck:
    # Nothing the pinned build prints shows it (unverifiable_fields.SAMPLING_UNSHOWN):
    # a caller that asks anyway is told so, as a mismatch with nothing observed.
    return FieldCheck(value, None, "the build's log and endpoints do not show the draft "
                                   "sampling")


def _lazy_tensors(value: object, report: LaunchReport) -> FieldCheck:
    if not isinstance(value, tuple):
        raise TypeError(f"compare_launch: lazy_tensors must be a tuple of names, got {value!r}")
    observed = report.lazy_tensors
    return FieldCheck(sorted(value), sorted(observed),
                      "the tensors logged 'lazy read enabled'" if observed else
                      "no tensor logged 'lazy read enabled'")


def _mmproj(value: object, report: LaunchReport) -> FieldCheck:
    loaded = report.projector_path
    return FieldCheck(str(value), loaded, "" if loaded else "no 'loaded multimodal model' line")


def _projector_on_gpu(value: object, report: LaunchReport) -> FieldCheck:
    backend = report.projector_backend
    if backend is None:
        return FieldCheck(value, None, "no 'CLIP using <backend> backend' line")
    return FieldCheck(value, backend != "CPU", f"CLIP using {backend} backend")


#: clip.cpp prints each size with two decimals: the sum is off by up to 0.01 MiB a figure.
_PRINTED_MIB = Decimal("0.01") * 2


def _projector_bytes(value: object, report: LaunchReport) -> FieldCheck:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"compare_launch: projector_bytes must be bytes, got {value!r}")
    printed = report.projector_mib
    if printed is None:
        return FieldCheck(value, None, "no 'load_hparams: model size' line")
    budget = Decimal(value) / (1 << 20)
    return FieldCheck(value, printed, f"the projector's model and metadata: {printed} MiB, "
                      f"the budget {budget:.2f} MiB", ok=abs(printed - budget) <= _PRINTED_MIB)


_COMPARERS: dict[str, Comparer] = {
    "ctx_size": _ctx_size,
    "parallel": _field("n_slots"),
    "batch_size": _batch_size,
    "ubatch_size": _ubatch_size,
    "cache_type_k": _field("type_k"),
    "cache_type_v": _field("type_v"),
    "flash_attn": _flash_attn,
    "drafter": _drafter,
    "spec_type": _spec_type,
    "n_ctx": _field("n_ctx"),
    "n_ctx_seq": _field("n_ctx_seq"),
    "n_batch": _field("n_batch"),
    "n_ubatch": _field("n_ubatch"),
    "n_slots": _field("n_slots"),
    "type_k": _field("type_k"),
    "type_v": _field("type_v"),
    "flash_attn_effective": _field("flash_attn"),
    "drafter_loaded": _field("drafter_loaded"),
    "mtp_context": _mtp_context,
    "speculative_ready": _field("speculative_ready"),
    "overrides": _override_count,
    "spec_draft_n_min": _draft_count("spec_draft_n_min", "n_min"),
    "spec_draft_n_max": _draft_count("spec_draft_n_max", "n_max"),
    "spec_draft_p_min": _spec_draft_p_min,
    "spec_draft_sampling": _spec_draft_sampling,
    "ctx_checkpoints": _field("ctx_checkpoints"),
    "lazy_tensors": _lazy_tensors,
    "mmproj": _mmproj,
    "projector_on_gpu": _projector_on_gpu,
    "projector_bytes": _projector_bytes,
    "checkpoint_min_step": _checkpoint_min_step,
    **PLACEMENT_COMPARERS,
}


def comparable_fields() -> Sequence[str]:
    """The keys ``compare_launch`` accepts."""
    return tuple(sorted(_COMPARERS))
