"""KV-cache sizing, byte for byte as llama-server allocates it (pure).

Ported from the pinned llama.cpp source rather than estimated:

- ``llama_context`` (src/llama-context.cpp): ``-c 0`` means the training context;
  ``n_batch = min(n_ctx, -b)`` and ``n_ubatch = min(n_batch, -ub)`` are taken *before*
  ``n_ctx`` is padded to a multiple of 256; with a unified cache every slot shares one
  stream of ``n_ctx`` cells, otherwise each of the ``-np`` slots gets its own stream of
  ``pad(n_ctx / np, 256)`` cells and ``n_ctx`` is rounded to ``np`` times that.
- llama-server (tools/server/server.cpp): ``-np`` unset (auto) means 4 slots *and* a
  unified cache; an explicit ``-np`` keeps ``--kv-unified`` off unless asked for.
- ``llama_kv_cache`` (src/llama-kv-cache.cpp): one K and one V tensor per cache-owning
  layer of ``ggml_row_size(type, n_embd_k_gqa(il))`` bytes per cell per stream; without
  flash attention V is stored transposed and every V row is padded to the widest layer's
  (``n_embd_v_gqa_max``). Its ``size = … MiB`` log line is what ``harness.verdicts.kv_log``
  reads back.
- ``llama_kv_cache_iswa`` (src/llama-kv-cache-iswa.cpp): a sliding-window model gets two
  caches, the full layers at ``n_ctx_seq`` cells and the windowed layers at
  ``pad(min(n_ctx_seq, n_swa·(unified ? np : 1) + n_ubatch), 256)`` cells (all
  ``n_ctx_seq`` with ``--swa-full``).
- ``llama_model::create_memory`` (src/llama-model.cpp): MTP (``nextn``) blocks, layers
  past ``n_layer_kv_from_start`` (shared KV) and recurrent layers own no K/V; a looped
  model's replayed layers each own one; recurrent layers keep
  ``max(1, np)·(1 + n_rs_seq)`` f32 rows of ``n_embd_r + n_embd_s`` values whatever the
  context (``llama_memory_recurrent``).
- ``llama_init_from_model``: which cache types the server refuses for a model (quantized
  V without flash attention; a block size that does not divide a head width).

Cache types are the nine ``-ctk/-ctv`` values of a stock server, sized from
``gguf.GGML_QUANT_SIZES``, plus fork-only types passed in as plain data (name, values per
block, bytes per block), e.g. ``configs/gpu/kv_types.json``.

The module stays whole because it is one ported algorithm: the cache types, the layer
layout and the sizing are each a step of the same allocation, checked line by line against
the source files listed above, and apart none of them is something llama.cpp computes.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import PurePath
from typing import Protocol

import gguf

from harness.errors import ConfigError
from harness.facts.gpu import STOCK_CACHE_TYPES, FlashAttn
from harness.facts.model_facts import ModelFacts
from harness.planning.release_rules import (
    OLD_MTP_KV_FILTERED,
    Rule,
    has,
    unset_context_slots,
)

#: The ``-ctk``/``-ctv`` values a stock llama-server accepts, in its order.
SERVER_CACHE_TYPES = STOCK_CACHE_TYPES
#: llama_context pads n_ctx and n_ctx_seq, and llama_kv_cache_iswa the window cache, to this.
CTX_PAD = 256
#: llama-server's ``-np`` auto value (tools/server/server.cpp), which also unifies the cache.
AUTO_PARALLEL = 4
#: common/common.h defaults of ``-b`` and ``-ub``.
DEFAULT_BATCH = 2048
DEFAULT_UBATCH = 512
#: Recurrent states are f32 (``GGML_TYPE_F32`` in create_memory).
_F32_BYTES = 4
MIB = 1024**2
GIB = 1024**3


# ``-fa auto`` builds the cache as if flash attention is on (``cparams.flash_attn`` is
# true until the device probe), and a quantized V turns it on.
class CacheRole(enum.StrEnum):
    """Which ``llama_kv_cache`` a plan row is; the iswa pair is logged non-SWA first."""

    KV = "kv"
    NON_SWA = "non-swa"
    SWA = "swa"


class CacheTypeSpec(Protocol):
    """A cache type as plain data: ``configs/gpu/kv_types.json`` entries have this shape."""

    @property
    def name(self) -> str: ...

    @property
    def block_size(self) -> int: ...

    @property
    def bytes_per_block(self) -> int: ...


@dataclass(frozen=True)
class KvCacheType:
    """``bytes_per_block`` bytes hold ``block_size`` values."""

    name: str
    block_size: int
    bytes_per_block: int

    @property
    def quantized(self) -> bool:
        """ggml_is_quantized: every block type; f32/f16/bf16 store single values."""
        return self.block_size > 1

    def row_bytes(self, values: int) -> int:
        """ggml_row_size: bytes of one row of ``values`` values."""
        return self.bytes_per_block * values // self.block_size

    def divides(self, values: int) -> bool:
        return values % self.block_size == 0


def server_cache_type(name: str) -> KvCacheType:
    """A stock ``-ctk/-ctv`` value, sized from gguf's ggml block table."""
    if name not in SERVER_CACHE_TYPES:
        raise ConfigError(f"'{name}' is not a llama-server cache type; "
                          f"known: {', '.join(SERVER_CACHE_TYPES)}")
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[name.upper()]]
    return KvCacheType(name, block, size)


def resolve_cache_type(name: str, fork_types: Iterable[CacheTypeSpec] = ()) -> KvCacheType:
    """A stock type, or one of ``fork_types`` (a fork's own name wins over nothing else)."""
    if name in SERVER_CACHE_TYPES:
        return server_cache_type(name)
    forks = {t.name: t for t in fork_types}
    if name in forks:
        spec = forks[name]
        if spec.block_size < 1 or spec.bytes_per_block < 1:
            raise ConfigError(f"cache type '{name}' has block size {spec.block_size} and "
                              f"{spec.bytes_per_block} bytes per block; both must be >= 1")
        return KvCacheType(spec.name, spec.block_size, spec.bytes_per_block)
    known = (*SERVER_CACHE_TYPES, *sorted(forks))
    raise ConfigError(f"unknown KV cache type '{name}'; known: {', '.join(known)} (fork-only "
                      "types come from configs/gpu/kv_types.json)")


# --- the model side -------------------------------------------------------------------


@dataclass(frozen=True)
class KvLayer:
    """One logical layer as the KV cache sees it (``llama_hparams`` per-layer values)."""

    index: int
    kv_heads: int
    head_k: int
    head_v: int
    swa: bool = False
    #: Owns K/V tensors in the main context (not MTP, not shared, not recurrent).
    cached: bool = True
    recurrent: bool = False

    @property
    def k_width(self) -> int:
        """n_embd_k_gqa(il)."""
        return self.kv_heads * self.head_k

    @property
    def v_width(self) -> int:
        """n_embd_v_gqa(il)."""
        return self.kv_heads * self.head_v


@dataclass(frozen=True)
class KvLayout:
    """What KV sizing needs of a model: every logical layer, in order."""

    name: str
    train_context: int
    layers: tuple[KvLayer, ...]
    #: ``n_layer()``: layers before the MTP blocks, the ones llama_init_from_model checks.
    trunk_layers: int
    #: n_swa; None when the model has no sliding window (a single cache).
    window: int | None = None
    #: f32 values one recurrent layer keeps per row: n_embd_r() + n_embd_s().
    recurrent_row: int = 0
    #: The llama.cpp release the layout is for (None: the pin), for the rules that apply
    #: only to some launches (harness/planning/release_rules.py).
    release: int | None = None

    @property
    def v_width_max(self) -> int:
        """n_embd_v_gqa_max(): the padded V row width without flash attention."""
        return max((layer.v_width for layer in self.layers), default=0)


def uniform_layout(n_layers: int, kv_heads: int, head_dim: int, *, name: str = "uniform",
                   train_context: int = 4096) -> KvLayout:
    """A plain full-attention stack (reference 001's bundle rows, docs/references.md)."""
    layers = tuple(KvLayer(i, kv_heads, head_dim, head_dim) for i in range(n_layers))
    return KvLayout(name, train_context, layers, n_layers)


def layout_from_facts(facts: ModelFacts, release: int | None = None) -> KvLayout:
    """The model's KV layout as llama.cpp ``release`` builds it (None: as the pin does);
    ConfigError when it is not modelled, NotModelled for a release no rule can place."""
    if facts.kv_unmodelled is not None:
        raise ConfigError(f"cannot plan the KV cache of {facts.path}: {facts.kv_unmodelled}")
    loops = max(1, facts.loop_count)
    if loops > 1 and facts.nextn_predict_layers:
        raise ConfigError(f"cannot plan the KV cache of {facts.path}: a looped model with MTP "
                          "blocks is not a layout llama.cpp builds")
    n_all = facts.block_count * loops
    trunk = n_all - facts.nextn_predict_layers
    # Before MTP_KV_EVERY_ARCH, most architectures gave their MTP blocks K/V as well.
    mtp_cached = (facts.nextn_predict_layers > 0
                  and not has(Rule.MTP_KV_EVERY_ARCH, release)
                  and facts.architecture not in OLD_MTP_KV_FILTERED)
    # gemma3n/gemma4: layers from n_layer_kv_from_start on reuse an earlier layer's cache.
    kv_from_start = n_all - facts.shared_kv_layers
    layers = []
    for il in range(n_all):
        phys = il % facts.block_count
        swa = _flag(facts.swa_layers, phys)
        recurrent = _flag(facts.recurrent_layers, phys)
        head_k = facts.key_length_swa if swa and facts.key_length_swa else facts.key_length
        head_v = facts.value_length_swa if swa and facts.value_length_swa else facts.value_length
        layers.append(KvLayer(
            index=il, kv_heads=facts.head_count_kv[phys], head_k=head_k, head_v=head_v,
            swa=swa, recurrent=recurrent,
            cached=(il < trunk or mtp_cached) and il < kv_from_start and not recurrent,
        ))
    recurrent_row = 0
    if any(layer.recurrent for layer in layers):
        if facts.ssm is None:
            raise ConfigError(f"cannot plan the recurrent state of {facts.path}: its header "
                              "has recurrent layers but no ssm.* sizes")
        ssm = facts.ssm
        # llama_hparams::n_embd_r / n_embd_s for Mamba-style (and gated delta net) layers
        conv_rows = max(0, ssm.conv_kernel - 1)
        recurrent_row = (conv_rows * (ssm.inner_size + 2 * ssm.group_count * ssm.state_size)
                         + ssm.state_size * ssm.inner_size)
    name = (f"{facts.architecture} {PurePath(facts.path).name}" if facts.path
            else facts.architecture)
    return KvLayout(name, facts.context_length, tuple(layers), trunk,
                    facts.sliding_window, recurrent_row, release)


def _flag(flags: Sequence[bool], il: int) -> bool:
    return il < len(flags) and flags[il]


# --- the launch side and the plan -----------------------------------------------------


@dataclass(frozen=True)
class KvRequest:
    """The launch flags KV sizing depends on; None means the server's default."""

    ctx_size: int | None = None
    parallel: int | None = None
    kv_unified: bool | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    flash_attn: FlashAttn = FlashAttn.AUTO
    swa_full: bool = False
    #: Recurrent rollback snapshots per sequence (``n_rs_seq``, set by speculative decoding).
    rs_seq: int = 0


@dataclass(frozen=True)
class KvCachePlan:
    """One ``llama_kv_cache``, with the figures its ``size = …`` log line prints."""

    role: CacheRole
    #: kv_size: cells per stream (the ``N cells`` of the log line).
    cells: int
    layers: int
    n_seq_max: int
    n_stream: int
    type_k: str
    type_v: str
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def all_cells(self) -> int:
        return self.cells * self.n_stream


@dataclass(frozen=True)
class KvPlan:
    """What the server will allocate for K/V (and recurrent state) on this launch."""

    #: The error llama_init_from_model prints when it refuses the cache types; None: accepted.
    refusal: str | None
    n_ctx: int
    n_ctx_seq: int
    n_seq_max: int
    n_stream: int
    n_ubatch: int
    flash_attn: bool
    #: In the order the server logs them (iswa: non-SWA, then SWA).
    caches: tuple[KvCachePlan, ...]
    recurrent_bytes: int
    #: K+V bytes per cell of one stream in the caches that grow with the context.
    bytes_per_token: int
    #: Bytes that do not grow with the context: the window cache and the recurrent state.
    fixed_bytes: int
    #: What one slot can fill: its own stream of every cache (with a unified cache the one
    #: shared stream, i.e. the whole pool) plus one sequence's recurrent state.
    per_slot_bytes: int
    reason: str

    @property
    def valid(self) -> bool:
        return self.refusal is None

    @property
    def k_bytes(self) -> int:
        return sum(c.k_bytes for c in self.caches)

    @property
    def v_bytes(self) -> int:
        return sum(c.v_bytes for c in self.caches)

    @property
    def kv_bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.recurrent_bytes

    @property
    def cells(self) -> int:
        """Cells allocated over every cache and stream."""
        return sum(c.all_cells for c in self.caches)

    def cache(self, role: CacheRole) -> KvCachePlan:
        for cache in self.caches:
            if cache.role is role:
                return cache
        raise KeyError(f"this plan has no {role.value} cache")


def unset_context(layout: KvLayout, n_seq: int, unified: bool) -> int:
    """The context a launch without ``-c`` gets: in the pin, common/fit.cpp (``-fit on``,
    the default, which plans never change) gives the training context per KV stream
    (``-np N`` without a unified cache: one a slot); other releases follow the fit rules
    of harness/planning/release_rules.py."""
    return layout.train_context * unset_context_slots(layout.release, n_seq, unified)


def plan_kv(layout: KvLayout, request: KvRequest,
            fork_types: Iterable[CacheTypeSpec] = ()) -> KvPlan:
    """Size the K/V caches llama-server creates for ``layout`` launched with ``request``."""
    forks = tuple(fork_types)
    type_k = resolve_cache_type(request.cache_type_k, forks)
    type_v = resolve_cache_type(request.cache_type_v, forks)
    if request.parallel is None or request.parallel < 0:
        n_seq, unified = AUTO_PARALLEL, True
    elif request.parallel == 0:
        raise ConfigError("-np 0 is refused by llama-server; use a positive slot count")
    else:
        n_seq, unified = request.parallel, bool(request.kv_unified)
    n_ctx = request.ctx_size or unset_context(layout, n_seq, unified)
    n_batch = min(n_ctx, request.batch_size or DEFAULT_BATCH)
    n_ubatch = min(n_batch, request.ubatch_size or DEFAULT_UBATCH)
    n_ctx = _pad(n_ctx, CTX_PAD)
    if unified:
        n_ctx_seq, n_stream = n_ctx, 1
    else:
        n_ctx_seq, n_stream = _pad(n_ctx // n_seq, CTX_PAD), n_seq
        n_ctx = n_ctx_seq * n_seq
    # -fa auto builds the cache with flash attention on: V is only transposed with -fa off.
    flash = request.flash_attn is not FlashAttn.OFF
    refusal = _refusal(layout, type_k, type_v, request.flash_attn)

    def cache(role: CacheRole, layers: Sequence[KvLayer], cells: int) -> KvCachePlan:
        k_row = sum(type_k.row_bytes(layer.k_width) for layer in layers)
        v_row = sum(type_v.row_bytes(layer.v_width if flash else layout.v_width_max)
                    for layer in layers)
        return KvCachePlan(role, cells, len(layers), n_seq, n_stream, type_k.name,
                           type_v.name, k_row * cells * n_stream, v_row * cells * n_stream)

    owners = [layer for layer in layout.layers if layer.cached]
    caches: tuple[KvCachePlan, ...]
    if not owners:
        caches = ()  # a purely recurrent model has no llama_kv_cache at all
    elif layout.window is None:
        caches = (cache(CacheRole.KV, owners, n_ctx_seq),)
    else:
        swa_cells = n_ctx_seq if request.swa_full else _pad(
            min(n_ctx_seq, layout.window * (n_seq if unified else 1) + n_ubatch), CTX_PAD)
        caches = (
            cache(CacheRole.NON_SWA, [la for la in owners if not la.swa], n_ctx_seq),
            cache(CacheRole.SWA, [la for la in owners if la.swa], swa_cells),
        )
    growing = [c for c in caches if c.role is not CacheRole.SWA]
    bytes_per_token = sum(c.total_bytes // c.all_cells for c in growing if c.all_cells)
    rows = max(1, n_seq) * (1 + max(0, request.rs_seq))
    recurrent_layers = sum(1 for layer in layout.layers[:layout.trunk_layers] if layer.recurrent)
    recurrent_bytes = recurrent_layers * rows * layout.recurrent_row * _F32_BYTES
    kv_total = sum(c.total_bytes for c in caches)
    fixed = kv_total - sum(c.total_bytes for c in growing) + recurrent_bytes
    per_slot = kv_total // n_stream + recurrent_bytes // max(1, n_seq)
    plan = KvPlan(
        refusal=refusal, n_ctx=n_ctx, n_ctx_seq=n_ctx_seq, n_seq_max=n_seq, n_stream=n_stream,
        n_ubatch=n_ubatch, flash_attn=flash, caches=caches,
        recurrent_bytes=recurrent_bytes, bytes_per_token=bytes_per_token, fixed_bytes=fixed,
        per_slot_bytes=per_slot, reason="",
    )
    return _with_reason(plan, layout, unified)


def kv_bytes_per_token(layout: KvLayout, cache_type_k: str = "f16", cache_type_v: str = "f16",
                       fork_types: Iterable[CacheTypeSpec] = ()) -> int:
    """K+V bytes one more context token costs one slot (flash attention on: no V padding).

    Counts the cache-owning full-attention layers: windowed layers and recurrent state do
    not grow with the context (they are ``KvPlan.fixed_bytes``)."""
    forks = tuple(fork_types)
    type_k = resolve_cache_type(cache_type_k, forks)
    type_v = resolve_cache_type(cache_type_v, forks)
    return sum(type_k.row_bytes(la.k_width) + type_v.row_bytes(la.v_width)
               for la in layout.layers if la.cached and not (layout.window is not None and la.swa))


def _pad(value: int, to: int) -> int:
    """GGML_PAD."""
    return (value + to - 1) // to * to


def _refusal(layout: KvLayout, type_k: KvCacheType, type_v: KvCacheType,
             flash_attn: FlashAttn) -> str | None:
    """llama_init_from_model's checks, in its order and with its wording."""
    if type_v.quantized and flash_attn is FlashAttn.OFF:
        return "quantized V cache requires flash_attn to be enabled"
    trunk = layout.layers[:layout.trunk_layers]
    if flash_attn is not FlashAttn.OFF:
        for kind, ctype, width in (("K", type_k, "n_embd_head_k"), ("V", type_v, "n_embd_head_v")):
            if not ctype.quantized:
                continue
            for layer in trunk:
                head = layer.head_k if kind == "K" else layer.head_v
                if not ctype.divides(head):
                    return (f"{kind} cache type {ctype.name} with block size {ctype.block_size} "
                            f"does not divide {width}={head}")
        return None
    # Without flash attention the server checks nothing more, but a K row that is not a
    # whole number of blocks cannot be stored (ggml_row_size asserts it in debug builds).
    for layer in layout.layers:
        if layer.cached and not type_k.divides(layer.k_width):
            return (f"K cache rows of {layer.k_width} values (layer {layer.index}) are not a "
                    f"whole number of {type_k.name} blocks of {type_k.block_size}")
    return None


def _with_reason(plan: KvPlan, layout: KvLayout, unified: bool) -> KvPlan:
    slots = (f"{plan.n_seq_max} slots sharing 1 unified stream" if unified
             else f"{plan.n_seq_max} slots, 1 stream each")
    if plan.refusal is not None:
        reason = f"{layout.name}: refused by llama-server: {plan.refusal}"
    elif not plan.caches:
        reason = (f"{layout.name}: no K/V cache; recurrent state "
                  f"{plan.recurrent_bytes / MIB:.2f} MiB ({slots})")
    else:
        parts = [f"{c.role.value} {c.cells} cells x {c.layers} layers: K ({c.type_k}) "
                 f"{c.k_bytes / MIB:.2f} MiB, V ({c.type_v}) {c.v_bytes / MIB:.2f} MiB"
                 for c in plan.caches]
        reason = (f"{layout.name}: n_ctx {plan.n_ctx}, {slots}, ubatch {plan.n_ubatch}, "
                  f"flash attention {'on' if plan.flash_attn else 'off'}; " + "; ".join(parts))
        if plan.recurrent_bytes:
            reason += f"; recurrent state {plan.recurrent_bytes / MIB:.2f} MiB"
    return replace(plan, reason=reason)
