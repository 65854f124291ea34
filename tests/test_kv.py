"""The KV planner (``harness/planning/kv.py``) against reference 001's tables, reference
003's layouts (sliding window, shared KV, looped, linear-attention hybrid) and the server;
both references are described in docs/references.md.

Figures the server printed for the fixtures are checked end to end in
``test_kv_vs_server.py``; here each rule gets its own arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.errors import ConfigError
from harness.facts.gpu import FlashAttn
from harness.facts.model_facts import ModelFacts, SsmFacts
from harness.planning.kv import (
    GIB,
    SERVER_CACHE_TYPES,
    CacheRole,
    KvLayer,
    KvLayout,
    KvRequest,
    kv_bytes_per_token,
    layout_from_facts,
    plan_kv,
    resolve_cache_type,
    server_cache_type,
    uniform_layout,
)
from harness.planning.release_rules import NotModelled

KIB = 1024


class Fork(NamedTuple):
    """A fork-only cache type as plain data (the shape of configs/gpu/kv_types.json entries)."""

    name: str
    block_size: int
    bytes_per_block: int


#: The QJL+Polar fork's block layouts, as configs/gpu/kv_types.json records them.
QJL = Fork("qjl1_256", 128, 34)
POLAR = Fork("q4_polar", 128, 82)
#: Reference 001 prices QJL K + Polar V at 4 bits a value each (FP16 / 4): these two
#: stand-ins reproduce its column exactly; the real layouts above are 2.125 + 5.125 bits.
QJL_AS_001 = Fork("qjl1_256", 32, 16)
POLAR_AS_001 = Fork("q4_polar", 32, 16)


def facts(**changes: object) -> ModelFacts:
    """A 4-layer llama with 2 KV heads of width 16; ``changes`` override any field."""
    base = ModelFacts(
        path="test.gguf", file_size=0, architecture="llama", block_count=4,
        context_length=4096, embedding_length=64, head_count=4, head_count_kv=(2,) * 4,
        key_length=16, value_length=16, vocab_size=269)
    return replace(base, **changes)  # type: ignore[arg-type]


# --- reference 001: KV bytes per token, per bundle -------------------------------------


class Bundle(NamedTuple):
    name: str
    layers: int
    f16_kib: int
    #: 001's "Q8K/Q4V" column, which is not what ggml allocates (see below).
    q8k_q4v_kib_in_001: int
    qjl_polar_kib: int


#: 001's table: every bundle has 8 KV heads of width 128.
BUNDLES = (
    Bundle("2B", 28, 112, 88, 28),
    Bundle("4B", 36, 144, 113, 36),
    Bundle("9B", 48, 192, 150, 48),
    Bundle("27B", 62, 248, 194, 62),
)


def bundle_layout(bundle: Bundle) -> KvLayout:
    return uniform_layout(bundle.layers, 8, 128, name=bundle.name, train_context=262144)


@pytest.mark.parametrize("bundle", BUNDLES, ids=[f"001-{b.name}-f16" for b in BUNDLES])
def test_f16_bytes_per_token_match_reference_001(bundle: Bundle) -> None:
    # 2 x layers x 8 heads x 128 x 2 bytes
    assert kv_bytes_per_token(bundle_layout(bundle)) == bundle.f16_kib * KIB


@pytest.mark.parametrize("bundle", BUNDLES, ids=[f"001-{b.name}-q8k-q4v" for b in BUNDLES])
def test_q8_k_q4_v_bytes_per_token_follow_the_ggml_blocks(bundle: Bundle) -> None:
    # q8_0 is 34 bytes per 32 values and q4_0 18 per 32 (gguf.GGML_QUANT_SIZES): a 128-wide
    # head costs 136 + 72 = 208 bytes a token. 001's column (88 KiB for 2B) is ~1.9x that.
    per_token = kv_bytes_per_token(bundle_layout(bundle), "q8_0", "q4_0")
    assert per_token == bundle.layers * 8 * (136 + 72)
    assert per_token < bundle.q8k_q4v_kib_in_001 * KIB


@pytest.mark.parametrize("bundle", BUNDLES, ids=[f"001-{b.name}-qjl-polar" for b in BUNDLES])
def test_qjl_polar_bytes_per_token_as_reference_001_prices_them(bundle: Bundle) -> None:
    per_token = kv_bytes_per_token(bundle_layout(bundle), "qjl1_256", "q4_polar",
                                   (QJL_AS_001, POLAR_AS_001))
    assert per_token == bundle.qjl_polar_kib * KIB


@pytest.mark.parametrize("bundle", BUNDLES, ids=[f"kv_types-{b.name}-qjl-polar" for b in BUNDLES])
def test_qjl_polar_bytes_per_token_with_the_fork_block_layouts(bundle: Bundle) -> None:
    # One 128-value block per head: 34 bytes of K + 82 bytes of V.
    per_token = kv_bytes_per_token(bundle_layout(bundle), "qjl1_256", "q4_polar", (QJL, POLAR))
    assert per_token == bundle.layers * 8 * (34 + 82)


class SlotRow(NamedTuple):
    bundle: Bundle
    ctx: int
    types: tuple[str, str]
    forks: tuple[Fork, ...]
    #: What the planner gives: ctx x bytes per token, exactly.
    gib: float
    #: The figure reference 001 prints for the row (None: a row 001 does not have).
    gib_in_001: float | None


_B = {b.name: b for b in BUNDLES}
_QP = ("qjl1_256", "q4_polar")
_AS_001 = (QJL_AS_001, POLAR_AS_001)
#: 001's "Per-slot KV at recommended context" rows. 001 rounds loosely: 27B at 32k is
#: 32 768 x 62 KiB = 1.94 GiB, printed "2.0".
SLOT_ROWS = {
    "001-2B-32k-qjl-polar": SlotRow(_B["2B"], 32768, _QP, _AS_001, 0.875, 0.88),
    "001-9B-65k-qjl-polar": SlotRow(_B["9B"], 65536, _QP, _AS_001, 3.0, 3.0),
    "001-27B-32k-qjl-polar": SlotRow(_B["27B"], 32768, _QP, _AS_001, 1.9375, 2.0),
    "001-27B-128k-qjl-polar": SlotRow(_B["27B"], 131072, _QP, _AS_001, 7.75, 8.0),
    "001-27B-256k-qjl-polar": SlotRow(_B["27B"], 262144, _QP, _AS_001, 15.5, 16.0),
    # 001 says 2.75 GiB (32 768 x 88 KiB); ggml's q8_0 + q4_0 blocks give 1.42 GiB.
    "ggml-2B-32k-q8k-q4v": SlotRow(_B["2B"], 32768, ("q8_0", "q4_0"), (), 1.421875, None),
    # The fork's real block layouts put 001's "3.0 GiB" 9B slot at 2.72 GiB.
    "kv_types-9B-65k-qjl-polar": SlotRow(_B["9B"], 65536, _QP, (QJL, POLAR), 2.71875, None),
}


@pytest.mark.parametrize("row", SLOT_ROWS.values(), ids=SLOT_ROWS.keys())
def test_per_slot_kv_at_the_recommended_context(row: SlotRow) -> None:
    plan = plan_kv(bundle_layout(row.bundle),
                   KvRequest(ctx_size=row.ctx, parallel=1, cache_type_k=row.types[0],
                             cache_type_v=row.types[1]), row.forks)
    assert plan.valid
    assert plan.per_slot_bytes == plan.kv_bytes == int(row.gib * GIB)
    assert plan.bytes_per_token * row.ctx == plan.kv_bytes
    if row.gib_in_001 is not None:
        assert plan.kv_bytes / GIB == pytest.approx(row.gib_in_001, rel=0.035)


# --- cache types ------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "block", "size"), [
    ("f32", 1, 4), ("f16", 1, 2), ("bf16", 1, 2), ("q8_0", 32, 34), ("q4_0", 32, 18),
    ("q4_1", 32, 20), ("iq4_nl", 32, 18), ("q5_0", 32, 22), ("q5_1", 32, 24),
], ids=str)
def test_every_server_cache_type_is_sized_from_the_ggml_block_table(name: str, block: int,
                                                                    size: int) -> None:
    ctype = server_cache_type(name)
    assert (ctype.block_size, ctype.bytes_per_block) == (block, size)
    assert ctype.quantized == (block > 1)


def test_the_server_list_is_llama_servers_own() -> None:
    assert SERVER_CACHE_TYPES == ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl",
                                  "q5_0", "q5_1")


def test_a_fork_type_is_accepted_as_plain_data() -> None:
    assert resolve_cache_type("q4_polar", [POLAR]).row_bytes(256) == 164


def test_an_unknown_cache_type_names_the_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"'q3_zz'.*q4_polar"):
        resolve_cache_type("q3_zz", [POLAR])


# --- how llama-server sizes the cache ---------------------------------------------------


DENSE = uniform_layout(2, 2, 16, name="dense")  # the 'dense' fixture's shape


class CtxCase(NamedTuple):
    request: KvRequest
    n_ctx: int
    cells: int
    seqs: tuple[int, int]


#: Rows measured on the pinned server with the 'dense' fixture (fixtures/models/README.md
#: and test_kv_log.py) plus the padding rules they follow.
CTX_CASES = {
    "c512-auto-np-is-4-unified": CtxCase(KvRequest(ctx_size=512), 512, 512, (4, 1)),
    "c1000-np3-rounds-per-slot": CtxCase(KvRequest(ctx_size=1000, parallel=3), 1536, 512, (3, 3)),
    "c100000-np1-pads-to-256": CtxCase(KvRequest(ctx_size=100000, parallel=1), 100096, 100096,
                                       (1, 1)),
    # -c 0 leaves the context to the fit step: the training context per stream, so each of
    # two slots gets 4096 (the pin logs n_ctx_slot = 4096; with -fit off it was 2048).
    "c0-np2-is-a-training-context-a-stream": CtxCase(KvRequest(ctx_size=0, parallel=2), 8192,
                                                     4096, (2, 2)),
    "unset-auto-np-is-one-training-context": CtxCase(KvRequest(), 4096, 4096, (4, 1)),
    "np2-kvu-shares-one-stream": CtxCase(KvRequest(ctx_size=700, parallel=2, kv_unified=True),
                                         768, 768, (2, 1)),
}


@pytest.mark.parametrize("case", CTX_CASES.values(), ids=CTX_CASES.keys())
def test_context_padding_and_slots(case: CtxCase) -> None:
    plan = plan_kv(DENSE, case.request)
    (cache,) = plan.caches
    assert (plan.n_ctx, cache.cells, (cache.n_seq_max, cache.n_stream)) == (
        case.n_ctx, case.cells, case.seqs)
    # 2 layers x 32 values x 2 bytes, for K and for V
    assert cache.k_bytes == cache.v_bytes == 2 * 32 * 2 * cache.cells * cache.n_stream
    assert plan.per_slot_bytes == plan.kv_bytes // cache.n_stream


def gemma2_like(window: int = 32) -> KvLayout:
    """The 'swa' fixture: layer 0 windowed, layer 1 full, 2 KV heads of width 16."""
    return KvLayout("swa", 4096, (KvLayer(0, 2, 16, 16, swa=True), KvLayer(1, 2, 16, 16)), 2,
                    window=window)


class SwaCase(NamedTuple):
    request: KvRequest
    full_cells: int
    swa_cells: int


SWA_CASES = {
    # window 32 x 4 unified slots + ubatch 512 = 640, padded to 768 (measured)
    "c4096-auto": SwaCase(KvRequest(ctx_size=4096), 4096, 768),
    # ubatch 64: 32 x 4 + 64 = 192 -> 256 (measured)
    "c4096-ub64": SwaCase(KvRequest(ctx_size=4096, batch_size=64, ubatch_size=64), 4096, 256),
    # per-slot streams: 32 + 100 = 132 -> 256, never more than the slot's cells (measured)
    "c40000-np3-ub100": SwaCase(KvRequest(ctx_size=40000, parallel=3, ubatch_size=100), 13568,
                                256),
    # n_batch = min(n_ctx, -b) before n_ctx is padded: 32 x 4 + 300 -> 512, capped at 512
    "c300-ubatch-is-capped-by-ctx": SwaCase(KvRequest(ctx_size=300), 512, 512),
    "swa-full": SwaCase(KvRequest(ctx_size=4096, swa_full=True), 4096, 4096),
}


@pytest.mark.parametrize("case", SWA_CASES.values(), ids=SWA_CASES.keys())
def test_windowed_layers_get_their_own_smaller_cache(case: SwaCase) -> None:
    plan = plan_kv(gemma2_like(), case.request)
    full, swa = plan.caches
    assert (full.role, swa.role) == (CacheRole.NON_SWA, CacheRole.SWA)
    assert (full.cells, swa.cells, full.layers, swa.layers) == (
        case.full_cells, case.swa_cells, 1, 1)


def test_windowed_plan_is_a_fixed_part_plus_a_slope() -> None:
    small, large = (plan_kv(gemma2_like(), KvRequest(ctx_size=c, parallel=1))
                    for c in (8192, 65536))
    assert small.fixed_bytes == large.fixed_bytes == 2 * 32 * 2 * 768  # window 32 + ub 512
    assert small.bytes_per_token == large.bytes_per_token == 2 * 32 * 2
    for plan in (small, large):
        assert plan.kv_bytes == plan.bytes_per_token * plan.n_ctx_seq + plan.fixed_bytes


def test_without_flash_attention_v_rows_are_padded_to_the_widest_layer() -> None:
    layout = KvLayout("mixed", 4096, (KvLayer(0, 4, 16, 16), KvLayer(1, 1, 16, 16)), 2)
    on = plan_kv(layout, KvRequest(ctx_size=256, parallel=1))
    off = plan_kv(layout, KvRequest(ctx_size=256, parallel=1, flash_attn=FlashAttn.OFF))
    assert on.k_bytes == off.k_bytes == (64 + 16) * 2 * 256
    assert on.v_bytes == (64 + 16) * 2 * 256
    assert off.v_bytes == (64 + 64) * 2 * 256


# --- refusals (llama_init_from_model) ---------------------------------------------------


class Refusal(NamedTuple):
    types: tuple[str, str]
    flash: FlashAttn
    message: str | None


REFUSALS = {
    "q8_0-k-head16-fa-auto": Refusal(("q8_0", "f16"), FlashAttn.AUTO,
                                     "K cache type q8_0 with block size 32 does not divide "
                                     "n_embd_head_k=16"),
    "q4_0-both-head16": Refusal(("q4_0", "q4_0"), FlashAttn.AUTO,
                                "K cache type q4_0 with block size 32 does not divide "
                                "n_embd_head_k=16"),
    "q8_0-v-head16-fa-on": Refusal(("f16", "q8_0"), FlashAttn.ON,
                                   "V cache type q8_0 with block size 32 does not divide "
                                   "n_embd_head_v=16"),
    "quantized-v-fa-off": Refusal(("f16", "q8_0"), FlashAttn.OFF,
                                  "quantized V cache requires flash_attn to be enabled"),
    # measured: the server starts and serves with -fa off -ctk q8_0 on the 'dense' fixture
    "q8_0-k-fa-off-is-unchecked": Refusal(("q8_0", "f16"), FlashAttn.OFF, None),
    "f32-both": Refusal(("f32", "f32"), FlashAttn.AUTO, None),
}


@pytest.mark.parametrize("case", REFUSALS.values(), ids=REFUSALS.keys())
def test_cache_types_the_server_refuses(case: Refusal) -> None:
    plan = plan_kv(DENSE, KvRequest(ctx_size=512, cache_type_k=case.types[0],
                                    cache_type_v=case.types[1], flash_attn=case.flash))
    assert plan.refusal == case.message
    assert plan.valid == (case.message is None)
    if case.message is not None:
        assert case.message in plan.reason


def test_a_head_width_of_32_takes_block_32_types() -> None:
    layout = uniform_layout(2, 1, 32)  # the 'mtp' fixture's attention
    for name in ("q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"):
        assert plan_kv(layout, KvRequest(cache_type_k=name, cache_type_v=name)).valid


def test_mtp_blocks_are_checked_and_skipped() -> None:
    # llama_init_from_model checks only n_layer() = trunk layers; the nextn block owns no
    # cache in the main context either.
    plan = plan_kv(layout_from_facts(facts(block_count=3, head_count_kv=(1, 1, 1),
                                           key_length=32, value_length=32,
                                           nextn_predict_layers=1)),
                   KvRequest(ctx_size=512, cache_type_k="q8_0", cache_type_v="q8_0"))
    assert plan.valid
    assert plan.caches[0].layers == 2


@pytest.mark.parametrize(("release", "cached"), [
    (None, 2),      # unknown release: planned as the pin
    (11434, 2),     # the pin
    (10909, 2),     # the first published release that leaves MTP blocks out everywhere
    (10901, 3),     # the last before it: glm4moe's MTP block owns K/V too
    (10502, 3),     # issue 23's release: logged "3 layers" on the mtp fixture
])
def test_mtp_blocks_own_kv_before_the_release_that_left_them_out(release: int | None,
                                                                 cached: int) -> None:
    mtp = facts(architecture="glm4moe", block_count=3, head_count_kv=(1, 1, 1),
                key_length=32, value_length=32, nextn_predict_layers=1)
    plan = plan_kv(layout_from_facts(mtp, release), KvRequest(ctx_size=512))
    assert plan.caches[0].layers == cached
    # The architectures that already left them out keep doing so.
    old_filtered = replace(mtp, architecture="step35")
    assert plan_kv(layout_from_facts(old_filtered, 10502),
                   KvRequest(ctx_size=512)).caches[0].layers == 2


def test_a_release_between_a_rules_ends_is_not_modelled() -> None:
    mtp = facts(architecture="glm4moe", block_count=3, head_count_kv=(1, 1, 1),
                key_length=32, value_length=32, nextn_predict_layers=1)
    with pytest.raises(NotModelled, match=r"not modelled for release 10905: .* after b10901 "
                                          r"and by b10909"):
        layout_from_facts(mtp, 10905)
    # A model without MTP blocks does not depend on the rule.
    assert layout_from_facts(replace(mtp, nextn_predict_layers=0), 10905).trunk_layers == 3


# --- reference 003's layouts from model facts ------------------------------------------


def gemma4_31b(shared: int = 0) -> ModelFacts:
    """Reference 003's Gemma 4 31b: 50 windowed layers x 16 heads x 256, 10 global layers x
    4 heads x 512 (5 windowed, then 1 global), window 1024."""
    pattern = tuple(i % 6 != 5 for i in range(60))
    return facts(architecture="gemma4", block_count=60, context_length=262144,
                 head_count_kv=tuple(16 if swa else 4 for swa in pattern),
                 key_length=512, value_length=512, key_length_swa=256, value_length_swa=256,
                 sliding_window=1024, swa_layers=pattern, shared_kv_layers=shared)


def test_gemma4_swa_full_is_about_55_gib_at_64k() -> None:
    # 003: "31b at 64K: ~55 GB real" under --swa-full, pricing windowed layers at their
    # own head width.
    plan = plan_kv(layout_from_facts(gemma4_31b()),
                   KvRequest(ctx_size=65536, parallel=1, swa_full=True))
    assert plan.kv_bytes == 55 * GIB


def test_gemma4_windowed_cache_is_small_and_fixed() -> None:
    plan = plan_kv(layout_from_facts(gemma4_31b()), KvRequest(ctx_size=65536, parallel=1))
    full, swa = plan.caches
    assert (full.layers, full.cells, swa.layers, swa.cells) == (10, 65536, 50, 1536)
    assert plan.bytes_per_token == 10 * 4 * (512 + 512) * 2
    assert plan.fixed_bytes == 50 * 16 * (256 + 256) * 2 * 1536


def test_shared_kv_layers_own_no_cache() -> None:
    plain = plan_kv(layout_from_facts(gemma4_31b()), KvRequest(ctx_size=8192, parallel=1))
    shared = plan_kv(layout_from_facts(gemma4_31b(shared=12)), KvRequest(ctx_size=8192,
                                                                         parallel=1))
    # the last 12 layers (10 windowed, 2 global) reuse earlier caches
    assert [c.layers for c in shared.caches] == [8, 40]
    assert shared.kv_bytes < plain.kv_bytes


def test_a_looped_model_caches_every_replayed_layer() -> None:
    once = plan_kv(layout_from_facts(facts()), KvRequest(ctx_size=1024, parallel=1))
    thrice = plan_kv(layout_from_facts(facts(architecture="nanbeige", loop_count=3)),
                     KvRequest(ctx_size=1024, parallel=1))
    assert thrice.caches[0].layers == 3 * once.caches[0].layers == 12
    assert thrice.kv_bytes == 3 * once.kv_bytes


def qwen35_like(layers: int = 40, interval: int = 4) -> ModelFacts:
    recurrent = tuple((i + 1) % interval != 0 for i in range(layers))
    return facts(architecture="qwen35moe", block_count=layers, head_count_kv=(2,) * layers,
                 key_length=256, value_length=256, full_attention_interval=interval,
                 recurrent_layers=recurrent,
                 ssm=SsmFacts(conv_kernel=4, inner_size=4096, state_size=128, group_count=16,
                              time_step_rank=32))


def test_a_linear_attention_hybrid_caches_only_its_full_attention_layers() -> None:
    # 003: "A 40-layer model at interval 4 therefore caches 10 layers, not 40".
    plan = plan_kv(layout_from_facts(qwen35_like()), KvRequest(ctx_size=4096, parallel=1))
    assert plan.caches[0].layers == 10
    assert plan.bytes_per_token == 10 * 2 * (256 + 256) * 2


def test_the_recurrent_state_is_per_slot_and_independent_of_context() -> None:
    layout = layout_from_facts(qwen35_like())
    # n_embd_r = (4 - 1) x (4096 + 2 x 16 x 128), n_embd_s = 128 x 4096, f32, 30 layers
    per_seq = 30 * ((3 * (4096 + 2 * 16 * 128)) + 128 * 4096) * 4
    short, long_ = (plan_kv(layout, KvRequest(ctx_size=c, parallel=1)) for c in (4096, 131072))
    assert short.recurrent_bytes == long_.recurrent_bytes == per_seq
    assert short.fixed_bytes == per_seq
    assert plan_kv(layout, KvRequest(ctx_size=4096, parallel=3)).recurrent_bytes == 3 * per_seq
    assert plan_kv(layout, KvRequest(ctx_size=4096, parallel=1, rs_seq=2)).recurrent_bytes == (
        3 * per_seq)


def test_a_pure_recurrent_model_has_no_kv_cache() -> None:
    mamba = facts(architecture="mamba", head_count_kv=(0,) * 4, recurrent_layers=(True,) * 4,
                  ssm=SsmFacts(conv_kernel=4, inner_size=128, state_size=16, group_count=0,
                               time_step_rank=4))
    plan = plan_kv(layout_from_facts(mamba), KvRequest(ctx_size=4096, parallel=1))
    assert plan.caches == ()
    assert plan.recurrent_bytes == 4 * (3 * 128 + 16 * 128) * 4


def test_an_unmodelled_memory_layout_is_refused_with_its_reason() -> None:
    with pytest.raises(ConfigError, match="MLA"):
        layout_from_facts(facts(kv_unmodelled="deepseek2: MLA cache"))


# --- properties -------------------------------------------------------------------------


@dataclass(frozen=True)
class Launch:
    layout: KvLayout
    request: KvRequest


@st.composite
def launches(draw: st.DrawFn) -> Launch:
    n_layers = draw(st.integers(1, 6))
    heads = draw(st.lists(st.integers(0, 8), min_size=n_layers, max_size=n_layers))
    swa = draw(st.lists(st.booleans(), min_size=n_layers, max_size=n_layers))
    window = draw(st.one_of(st.none(), st.integers(1, 5000)))
    head = draw(st.sampled_from((32, 64, 128)))
    layout = KvLayout("prop", draw(st.integers(256, 131072)),
                      tuple(KvLayer(i, h, head, head, swa=s) for i, (h, s) in
                            enumerate(zip(heads, swa, strict=True))),
                      n_layers, window=window)
    parallel = draw(st.one_of(st.none(), st.integers(1, 8)))
    request = KvRequest(
        parallel=parallel, kv_unified=draw(st.booleans()),
        batch_size=draw(st.one_of(st.none(), st.integers(1, 4096))),
        ubatch_size=draw(st.one_of(st.none(), st.integers(1, 4096))),
        cache_type_k=draw(st.sampled_from(SERVER_CACHE_TYPES)),
        cache_type_v=draw(st.sampled_from(SERVER_CACHE_TYPES)),
        flash_attn=draw(st.sampled_from(FlashAttn)), swa_full=draw(st.booleans()))
    return Launch(layout, request)


@given(launches(), st.integers(1, 300000), st.integers(0, 300000))
def test_more_context_never_gives_fewer_bytes(launch: Launch, ctx: int, more: int) -> None:
    smaller = plan_kv(launch.layout, replace(launch.request, ctx_size=ctx))
    larger = plan_kv(launch.layout, replace(launch.request, ctx_size=ctx + more))
    assert larger.total_bytes >= smaller.total_bytes
    assert larger.cells >= smaller.cells
    assert larger.per_slot_bytes >= smaller.per_slot_bytes


@given(launches(), st.integers(1, 300000))
def test_a_plan_is_its_slope_times_the_cells_plus_its_fixed_part(launch: Launch,
                                                                  ctx: int) -> None:
    plan = plan_kv(launch.layout, replace(launch.request, ctx_size=ctx))
    assert plan.total_bytes == (plan.bytes_per_token * plan.n_ctx_seq * plan.n_stream
                                + plan.fixed_bytes)
    assert plan.k_bytes + plan.v_bytes == sum(c.total_bytes for c in plan.caches)


#: The 'dense' fixture's facts (DENSE is its layout as the pin builds it).
DENSE_FACTS = facts(block_count=2, head_count_kv=(2, 2), key_length=16, value_length=16)

#: (release, -np (None: auto, 4 unified slots), cells of the stream or of each) for a
#: launch without -c of the 'dense' fixture (training context 4096). The fit rules' ends
#: were read in each release's common/fit.cpp; b11104's 16384 cells at the auto -np is
#: what the release matrix measured (README), where the pin logs 4096.
UNSET_CONTEXT_CASES = [
    (None, None, 4096 * 1),          # the pin: auto -np (4 slots, unified), one context
    (11434, 2, 4096),                # the pin's release: -np 2, one context a slot
    (11205, None, 4096),             # the first release that sized per stream again
    (11200, None, 4096 * 4),         # the last that sized per sequence
    (11104, None, 4096 * 4),         # the release matrix's row: 16384 cells
    (11003, None, 4096 * 4),         # the first that did
    (10991, None, 4096),             # the last before it: per stream
    (11104, 2, 4096),                # without a unified cache every window agrees
    (10588, 2, 4096),                # the first release whose fit sized the context at all
    (10581, 2, 2048),                # the last before: one context split between the slots
    (10581, None, 4096),             # ... which a unified cache never noticed
]


@pytest.mark.parametrize(("release", "parallel", "cells"), UNSET_CONTEXT_CASES)
def test_the_context_of_a_launch_without_c_follows_the_release(
        release: int | None, parallel: int | None, cells: int) -> None:
    plan = plan_kv(layout_from_facts(DENSE_FACTS, release), KvRequest(parallel=parallel))
    (cache,) = plan.caches
    assert cache.cells == cells


@pytest.mark.parametrize(("release", "parallel"), [(11202, None), (10585, 2)])
def test_a_release_inside_a_fit_window_is_not_modelled_only_where_it_matters(
        release: int, parallel: int | None) -> None:
    layout = layout_from_facts(DENSE_FACTS, release)
    with pytest.raises(NotModelled, match=rf"not modelled for release {release}: "
                                          r"'an unset context is sized per"):
        plan_kv(layout, KvRequest(parallel=parallel))
    # With -c, or with one slot, no rule decides it: the plan stands.
    assert plan_kv(layout, KvRequest(ctx_size=1024, parallel=parallel)).n_ctx == 1024
    assert plan_kv(layout, KvRequest(parallel=1)).n_ctx == 4096
