"""Hyperparameters from GGUF metadata, with the defaults the pinned llama.cpp applies.

Ported from ``llama_model_base::load_hparams`` in ``src/llama-model.cpp`` (the keys every
architecture shares: head counts, ``attention.key_length``, ``rope.dimension_count``
defaulting to the head width, ``rope.freq_base`` defaulting to 10000, the linear RoPE
scale, ``n_layer = block_count - nextn_predict_layers``), the per-architecture
``load_arch_hparams`` in ``src/models/<arch>.cpp``, ``llama_model_rope_type`` (NORM for
llama, NEOX for gemma2 and glm4moe) and ``llama_hparams::set_swa_pattern`` in
``src/llama-hparams.cpp``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

from harness.errors import FixtureError
from harness.reference.gguf_read import GgufContents, MetaValue
from harness.reference.moe import Gating, Routing
from harness.reference.rope import RopeType

#: ``{arch}.expert_gating_func`` values (llama.cpp's llama_expert_gating_func_type).
_GATING_BY_ID = {1: Gating.SOFTMAX, 2: Gating.SIGMOID}


@dataclass(frozen=True)
class HParams:
    """What one forward pass needs to know besides the weights.

    ``n_layer`` counts the trunk blocks only (``block_count - nextn_predict_layers``);
    ``swa_layers[il]`` is True where layer ``il`` attends through the sliding window of
    ``sliding_window`` tokens; ``attn_scale`` multiplies q·k (gemma2 applies it to Q
    before the soft-cap, which is the same number); a soft-cap of None is off.
    """

    architecture: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    rope_type: RopeType
    rope_base: float
    rope_base_swa: float
    rope_freq_scale: float
    rms_eps: float
    attn_scale: float
    sliding_window: int
    swa_layers: tuple[bool, ...]
    attn_softcap: float | None
    final_softcap: float | None
    routing: Routing | None
    n_layer_dense_lead: int


class _Meta:
    """Typed reads of ``{arch}.*`` keys; a wrong type is a FixtureError naming the file."""

    def __init__(self, contents: GgufContents) -> None:
        self.path: Path = contents.path
        self.arch = contents.architecture
        self.raw = contents.metadata

    def get(self, suffix: str) -> MetaValue | None:
        return self.raw.get(f"{self.arch}.{suffix}")

    def int_(self, suffix: str, default: int | None = None) -> int:
        value: object = self.get(suffix)
        if value is None:
            if default is None:
                raise FixtureError(f"{self.path}: required key {self.arch}.{suffix} is missing")
            return default
        if isinstance(value, list):
            # llama.cpp's get_key_or_arr: one value per layer; the reference takes a
            # per-layer value only when every layer has the same one.
            if not value or any(v != value[0] for v in value):
                raise FixtureError(
                    f"{self.path}: {self.arch}.{suffix} differs per layer ({value}); the "
                    "reference supports one value for every layer"
                )
            value = value[0]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FixtureError(f"{self.path}: {self.arch}.{suffix} is not a number: {value!r}")
        return int(value)

    def float_(self, suffix: str, default: float) -> float:
        value = self.get(suffix)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise FixtureError(f"{self.path}: {self.arch}.{suffix} is not a number: {value!r}")
        return float(value)

    def bool_(self, suffix: str, default: bool) -> bool:
        value = self.get(suffix)
        return default if value is None else bool(value)

    def unsupported(self, what: str) -> FixtureError:
        return FixtureError(f"{self.path}: {self.arch} {what} is not supported by the reference")


def read_hparams(contents: GgufContents) -> HParams:
    """The hyperparameters of ``contents``' architecture (one the reference implements)."""
    m = _Meta(contents)
    readers = {"llama": _llama, "gemma2": _gemma2, "glm4moe": _glm4moe}
    reader = readers.get(m.arch)
    if reader is None:
        raise FixtureError(
            f"{m.path}: architecture {m.arch!r} is not supported by the reference model "
            f"(it implements {', '.join(sorted(readers))})"
        )
    return reader(m, _common(m))


def _common(m: _Meta) -> HParams:
    """The keys every architecture shares, with no SWA, soft-cap or experts yet."""
    n_embd = m.int_("embedding_length")
    n_layer = m.int_("block_count") - m.int_("nextn_predict_layers", 0)
    n_head = m.int_("attention.head_count")
    n_head_kv = m.int_("attention.head_count_kv", n_head)
    head_dim = m.int_("attention.key_length", n_embd // n_head)
    if m.int_("attention.value_length", n_embd // n_head) != head_dim:
        raise m.unsupported("attention.value_length different from key_length")
    if n_head % n_head_kv:
        raise m.unsupported(f"head_count {n_head} not a multiple of head_count_kv {n_head_kv}")
    if m.get("attention.layer_norm_rms_epsilon") is None:
        raise FixtureError(
            f"{m.path}: required key {m.arch}.attention.layer_norm_rms_epsilon is missing"
        )
    rope_base = m.float_("rope.freq_base", 10000.0)
    return HParams(
        architecture=m.arch,
        n_embd=n_embd,
        n_layer=n_layer,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=head_dim,
        n_rot=m.int_("rope.dimension_count", head_dim),
        rope_type=RopeType.NORM,
        rope_base=rope_base,
        rope_base_swa=rope_base,
        rope_freq_scale=_rope_freq_scale(m),
        rms_eps=m.float_("attention.layer_norm_rms_epsilon", 0.0),
        attn_scale=1.0 / math.sqrt(head_dim),
        sliding_window=0,
        swa_layers=(False,) * n_layer,
        attn_softcap=None,
        final_softcap=None,
        routing=None,
        n_layer_dense_lead=0,
    )


def _rope_freq_scale(m: _Meta) -> float:
    """``rope.scaling.type`` none/linear only: freq_scale = 1/factor (llama-model.cpp)."""
    kind = m.get("rope.scaling.type") or "linear"
    if kind == "none":
        return 1.0
    if kind != "linear":
        raise m.unsupported(f"rope.scaling.type {kind!r}")
    factor = m.float_("rope.scaling.factor", 0.0) or m.float_("rope.scale_linear", 0.0)
    return 1.0 if factor == 0.0 else 1.0 / factor


def _llama(m: _Meta, base: HParams) -> HParams:
    # src/models/llama.cpp: NORM rope over the whole head (llama-model.cpp throws when
    # rope.dimension_count differs from the head width); MoE through build_moe_ffn with
    # softmax gating, norm_w=true and hparams.expert_weights_scale, which llama's
    # load_arch_hparams never reads, so it stays 0 (no scaling).
    if base.n_rot != base.head_dim:
        raise FixtureError(
            f"{m.path}: llama rope.dimension_count {base.n_rot} differs from the head width "
            f"{base.head_dim} (llama.cpp rejects it too)"
        )
    n_expert = m.int_("expert_count", 0)
    if not n_expert:
        return base
    routing = Routing(
        gating=Gating.SOFTMAX,
        n_expert=n_expert,
        n_expert_used=m.int_("expert_used_count"),
        norm_weights=True,
        weights_scale=0.0,
    )
    return replace(base, routing=routing)


def _gemma2(m: _Meta, base: HParams) -> HParams:
    # src/models/gemma2.cpp load_arch_hparams: SWA standard, window default 4096,
    # load_swa_pattern(ml, 2) (dense_first=false: layer il is SWA when il % 2 < 1, i.e.
    # the even layers), the SWA layers' rope base from rope.freq_base_swa or the global
    # one, attention scale 1/sqrt(head width) except the 27B (46 layers), which uses
    # 1/sqrt(n_embd/n_head); soft-caps default to 50 and 30 (llama-hparams.h).
    if base.n_layer == 46:
        scale = 1.0 / math.sqrt(float(base.n_embd // base.n_head))
    else:
        scale = 1.0 / math.sqrt(float(base.head_dim))
    return replace(
        base,
        rope_type=RopeType.NEOX,
        rope_base_swa=m.float_("rope.freq_base_swa", base.rope_base),
        attn_scale=scale,
        sliding_window=m.int_("attention.sliding_window", 4096),
        swa_layers=_swa_pattern(m, base.n_layer, period=2, dense_first=False),
        attn_softcap=m.float_("attn_logit_softcapping", 50.0),
        final_softcap=m.float_("final_logit_softcapping", 30.0),
    )


def _swa_pattern(m: _Meta, n_layer: int, *, period: int, dense_first: bool) -> tuple[bool, ...]:
    """``load_swa_pattern`` in src/llama-model.cpp.

    A bool array ``attention.sliding_window_pattern`` gives the per-layer flags; an
    integer replaces the architecture's default period; then ``swa_flags``.
    """
    raw = m.get("attention.sliding_window_pattern")
    if isinstance(raw, list):
        if len(raw) < n_layer:
            raise FixtureError(
                f"{m.path}: {m.arch}.attention.sliding_window_pattern has {len(raw)} "
                f"entries for {n_layer} layers"
            )
        return tuple(bool(v) for v in raw[:n_layer])
    n = period if raw is None else m.int_("attention.sliding_window_pattern")
    return swa_flags(n_layer, n, dense_first=dense_first)


def swa_flags(n_layer: int, n_pattern: int, *, dense_first: bool) -> tuple[bool, ...]:
    """``llama_hparams::set_swa_pattern`` (src/llama-hparams.cpp): layer ``il`` is SWA
    when ``n_pattern == 0`` or ``il % n_pattern < n_pattern - 1`` (with dense_first:
    ``il % n_pattern != 0``)."""
    if dense_first:
        return tuple(n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer))
    return tuple(n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer))


def _glm4moe(m: _Meta, base: HParams) -> HParams:
    # src/models/glm4-moe.cpp: NEOX rope over rope.dimension_count of the head (no M-RoPE
    # sections), leading dense blocks, routed experts through build_moe_ffn with
    # exp_probs_b, expert_weights_norm (default false), expert_weights_scale (default 0:
    # none) and expert_gating_func (0/absent means sigmoid), plus a shared expert.
    sections = m.get("rope.dimension_sections")
    if isinstance(sections, list) and len(sections) > 1 and sections[0] and sections[1]:
        raise m.unsupported("M-RoPE (rope.dimension_sections)")
    if m.int_("expert_group_count", 0) > 1:
        raise m.unsupported("expert groups (expert_group_count > 1)")
    gating_id = m.int_("expert_gating_func", 0)
    gating = Gating.SIGMOID if gating_id == 0 else _GATING_BY_ID.get(gating_id)
    if gating is None:
        raise m.unsupported(f"expert_gating_func {gating_id}")
    routing = Routing(
        gating=gating,
        n_expert=m.int_("expert_count"),
        n_expert_used=m.int_("expert_used_count"),
        norm_weights=m.bool_("expert_weights_norm", False),
        weights_scale=m.float_("expert_weights_scale", 0.0),
    )
    return replace(
        base,
        rope_type=RopeType.NEOX,
        routing=routing,
        n_layer_dense_lead=m.int_("leading_dense_block_count", 0),
    )
