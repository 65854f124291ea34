"""The KV planner against the real server: planned K and V bytes equal what
``llama_kv_cache: size = …`` prints, for every serving fixture and cache type.

Each case starts one llama-server with the fixture and the launch flags, reads its
cache lines (two for the sliding-window fixture) and compares cells, layers, seqs, types
and the K, V and total MiB to the two decimals the server prints. A combination the
server refuses must be refused by the server *and* predicted invalid by the planner,
with the planner's reason being the server's own error line.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from harness import modelgen
from harness.errors import ServerExitedError
from harness.facts.gpu import FlashAttn
from harness.planning.kv import KvPlan, KvRequest, layout_from_facts, plan_kv
from harness.planning.launch import LaunchSpec
from harness.plugin import StartServer
from harness.probes.gguf_facts import read_model_facts
from harness.verdicts.kv_log import check_kv_plan, mib_as_logged, parse_kv_cache_lines

pytestmark = pytest.mark.server

SERVING_FIXTURES = ("dense", "moe", "drafter", "drafter-foreign", "swa", "mtp")
CACHE_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Case:
    fixture: str
    cache_type: str
    #: V cache type when it differs from K's (``cache_type``).
    cache_type_v: str | None = None
    ctx_size: int = 2048
    parallel: int | None = None
    ubatch_size: int | None = None
    batch_size: int | None = None
    flash_attn: FlashAttn = FlashAttn.AUTO
    kv_unified: bool = False
    swa_full: bool = False

    @property
    def v_type(self) -> str:
        return self.cache_type_v or self.cache_type

    def launch(self, fixture_set: modelgen.FixtureSet) -> LaunchSpec:
        extra: tuple[str, ...] = ()
        if self.flash_attn is not FlashAttn.AUTO:
            extra += ("-fa", self.flash_attn.value)
        if self.kv_unified:
            extra += ("-kvu",)
        if self.swa_full:
            extra += ("--swa-full",)
        return LaunchSpec(model=fixture_set.model(self.fixture), ctx_size=self.ctx_size,
                          parallel=self.parallel, batch_size=self.batch_size,
                          ubatch_size=self.ubatch_size, cache_type_k=self.cache_type,
                          cache_type_v=self.v_type, extra_args=extra)

    def plan(self, fixture_set: modelgen.FixtureSet) -> KvPlan:
        layout = layout_from_facts(read_model_facts(fixture_set.model(self.fixture)))
        return plan_kv(layout, KvRequest(
            ctx_size=self.ctx_size, parallel=self.parallel, kv_unified=self.kv_unified,
            batch_size=self.batch_size, ubatch_size=self.ubatch_size,
            cache_type_k=self.cache_type, cache_type_v=self.v_type,
            flash_attn=self.flash_attn, swa_full=self.swa_full))


def matrix_case(fixture: str, cache_type: str) -> Case:
    # A quantized V cache needs flash attention: ask for it explicitly.
    fa = FlashAttn.AUTO if cache_type == "f16" else FlashAttn.ON
    return Case(fixture, cache_type, flash_attn=fa)


CASES = {f"{f}-{t}": matrix_case(f, t) for f in SERVING_FIXTURES for t in CACHE_TYPES}
# Launch shapes beyond the default: per-slot streams, ubatch, unified, -fa off, --swa-full.
CASES |= {
    "dense-f16-c1000-np3": Case("dense", "f16", ctx_size=1000, parallel=3),
    "dense-f16-c700-np2-kvu": Case("dense", "f16", ctx_size=700, parallel=2, kv_unified=True),
    "moe-f32-fa-off": Case("moe", "f32", ctx_size=512, parallel=1, flash_attn=FlashAttn.OFF),
    "swa-f16-c40000-np3-ub100": Case("swa", "f16", ctx_size=40000, parallel=3, ubatch_size=100),
    "swa-f16-c4096-ub64": Case("swa", "f16", ctx_size=4096, batch_size=64, ubatch_size=64),
    "swa-f16-swa-full": Case("swa", "f16", ctx_size=1024, swa_full=True),
    "swa-f16-fa-off": Case("swa", "f16", ctx_size=1024, parallel=2, flash_attn=FlashAttn.OFF),
    "mtp-q4_0-c20000": Case("mtp", "q4_0", ctx_size=20000, flash_attn=FlashAttn.ON),
    "mtp-q8_0-fa-off": Case("mtp", "q8_0", ctx_size=512, flash_attn=FlashAttn.OFF),
    # Without flash attention the server does not check K's block size: it starts, and
    # the 2 x 16-value K rows are whole q8_0 blocks.
    "dense-q8_0k-f16v-fa-off": Case("dense", "q8_0", "f16", ctx_size=512,
                                    flash_attn=FlashAttn.OFF),
    "mtp-q8_0k-q4_0v": Case("mtp", "q8_0", "q4_0", flash_attn=FlashAttn.ON),
}


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_planned_kv_cache_is_what_the_server_allocates(
        case: Case, fixture_set: modelgen.FixtureSet, start_server: StartServer) -> None:
    plan = case.plan(fixture_set)
    if not plan.valid:
        assert plan.refusal is not None
        with pytest.raises(ServerExitedError) as refused:
            start_server(case.launch(fixture_set))
        assert plan.refusal in str(refused.value), plan.reason
        return
    log = start_server(case.launch(fixture_set)).log_text()
    lines = parse_kv_cache_lines(log)
    assert check_kv_plan(plan, lines) is None, (check_kv_plan(plan, lines), plan.reason)
    for cache, line in zip(plan.caches, lines, strict=True):
        assert (mib_as_logged(cache.k_bytes), mib_as_logged(cache.v_bytes)) == (
            line.k_mib, line.v_mib)
