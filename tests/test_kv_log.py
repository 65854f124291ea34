"""The KV-cache log parser and plan check (``harness/verdicts/kv_log.py``) on real lines.

Every log excerpt below was printed by the pinned llama-server (CPU build, ``-lv 4``)
for the fixtures named in its comment.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from harness.planning.kv import CacheRole, KvLayer, KvLayout, KvRequest, plan_kv, uniform_layout
from harness.verdicts.kv_log import (
    KvLogLine,
    check_kv_plan,
    mib_as_logged,
    parse_kv_cache_lines,
)

# -m dense.gguf -c 512
DENSE_512 = """\
0.00.011.421 I llama_context: n_ctx                 = 512
0.00.011.421 I llama_context: n_ctx_seq             = 512
0.00.011.463 I llama_kv_cache:        CPU KV buffer size =     0.12 MiB
0.00.011.474 I llama_kv_cache: size =    0.12 MiB (   512 cells,   2 layers,  4/1 seqs), \
K (f16):    0.06 MiB, V (f16):    0.06 MiB
0.00.011.474 I llama_kv_cache: n_rot_k = 0, n_embd_head_k_all = 16
"""

# -m dense.gguf -c 100000 -np 1
DENSE_100000 = """\
0.00.029.131 I llama_kv_cache: size =   24.44 MiB (100096 cells,   2 layers,  1/1 seqs), \
K (f16):   12.22 MiB, V (f16):   12.22 MiB
"""

# -m swa.gguf -c 40000 -np 3 -ub 100
SWA_NP3 = """\
0.00.012.928 I llama_kv_cache_iswa: creating non-SWA KV cache, size = 13568 cells
0.00.017.211 I llama_kv_cache: size =    4.97 MiB ( 13568 cells,   1 layers,  3/3 seqs), \
K (f16):    2.48 MiB, V (f16):    2.48 MiB
0.00.017.216 I llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells
0.00.017.616 I llama_kv_cache: size =    0.09 MiB (   256 cells,   1 layers,  3/3 seqs), \
K (f16):    0.05 MiB, V (f16):    0.05 MiB
"""

# -m mtp.gguf -c 20000 -ctk q4_0 -ctv q8_0 (K and V round separately: 0.69 + 1.31 = 2.01)
MTP_MIXED = """\
0.00.009.962 I llama_kv_cache: size =    2.01 MiB ( 20224 cells,   2 layers,  4/1 seqs), \
K (q4_0):    0.69 MiB, V (q8_0):    1.31 MiB
"""

# -m dense.gguf -c 512 -ctk q8_0: refused, no cache line at all
DENSE_REFUSED = """\
0.00.006.609 E llama_init_from_model: K cache type q8_0 with block size 32 does not divide \
n_embd_head_k=16
0.00.010.171 E srv  llama_server: exiting due to model loading error
"""


def test_a_single_cache_line() -> None:
    assert parse_kv_cache_lines(DENSE_512) == (KvLogLine(
        role=CacheRole.KV, size_mib=Decimal("0.12"), cells=512, layers=2, n_seq_max=4,
        n_stream=1, type_k="f16", k_mib=Decimal("0.06"), type_v="f16", v_mib=Decimal("0.06")),)


def test_the_two_caches_of_a_sliding_window_model_keep_their_roles() -> None:
    full, swa = parse_kv_cache_lines(SWA_NP3)
    assert (full.role, full.cells, full.n_seq_max, full.n_stream) == (
        CacheRole.NON_SWA, 13568, 3, 3)
    assert (swa.role, swa.cells, swa.k_mib, swa.size_mib) == (
        CacheRole.SWA, 256, Decimal("0.05"), Decimal("0.09"))


def test_mixed_cache_types() -> None:
    (line,) = parse_kv_cache_lines(MTP_MIXED)
    assert (line.type_k, line.k_mib, line.type_v, line.v_mib, line.size_mib) == (
        "q4_0", Decimal("0.69"), "q8_0", Decimal("1.31"), Decimal("2.01"))


def test_a_refused_start_has_no_cache_line() -> None:
    assert parse_kv_cache_lines(DENSE_REFUSED) == ()


@pytest.mark.parametrize(("n_bytes", "printed"), [
    (65536, "0.06"),            # dense -c 512: 2 layers x 32 values x 2 bytes x 512 cells
    (728064, "0.69"),           # mtp q4_0 K at 20224 cells
    (1375232, "1.31"),          # mtp q8_0 V
    (728064 + 1375232, "2.01"),
    (12812288, "12.22"),        # dense f16 K at 100096 cells
    # past 2**24 a float cannot hold every byte count: the C rounds 16792945 to
    # 16792944 before dividing and prints 16.01 where double precision says 16.02
    (16792945, "16.01"),
], ids=str)
def test_mib_are_rounded_like_the_servers_float_arithmetic(n_bytes: int, printed: str) -> None:
    assert mib_as_logged(n_bytes) == Decimal(printed)


DENSE = uniform_layout(2, 2, 16)
SWA = KvLayout("swa", 4096, (KvLayer(0, 2, 16, 16, swa=True), KvLayer(1, 2, 16, 16)), 2,
               window=32)
MTP = uniform_layout(2, 1, 32)


@pytest.mark.parametrize(("layout", "request_", "log"), [
    (DENSE, KvRequest(ctx_size=512), DENSE_512),
    (DENSE, KvRequest(ctx_size=100000, parallel=1), DENSE_100000),
    (SWA, KvRequest(ctx_size=40000, parallel=3, ubatch_size=100), SWA_NP3),
    (MTP, KvRequest(ctx_size=20000, cache_type_k="q4_0", cache_type_v="q8_0"), MTP_MIXED),
], ids=["dense-c512", "dense-c100000-np1", "swa-np3-ub100", "mtp-q4k-q8v"])
def test_plans_agree_with_the_logged_lines(layout: KvLayout, request_: KvRequest,
                                           log: str) -> None:
    assert check_kv_plan(plan_kv(layout, request_), parse_kv_cache_lines(log)) is None


def test_a_mismatch_says_what_differs() -> None:
    plan = plan_kv(DENSE, KvRequest(ctx_size=1024))
    message = check_kv_plan(plan, parse_kv_cache_lines(DENSE_512))
    assert message is not None
    assert "cells planned 1024 logged 512" in message
    assert "K MiB planned 0.12 logged 0.06" in message


def test_a_missing_cache_is_reported() -> None:
    plan = plan_kv(SWA, KvRequest(ctx_size=4096))
    message = check_kv_plan(plan, parse_kv_cache_lines(DENSE_512))
    assert message == "planned 2 KV cache(s) (non-swa, swa), the log shows 1 (kv)"
