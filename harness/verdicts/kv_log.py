"""The KV-cache size lines of a llama-server startup log, and a check of a plan against them.

``llama_kv_cache``'s constructor (src/llama-kv-cache.cpp of the pinned source) logs, at
INFO (``-lv 4``), one line per cache:

    llama_kv_cache: size =    0.12 MiB (   512 cells,   2 layers,  4/1 seqs),
        K (f16):    0.06 MiB, V (f16):    0.06 MiB

(one line in the log, wrapped here).
``seqs`` is ``n_seq_max/n_stream``. A sliding-window model logs two caches, each announced
by ``llama_kv_cache_iswa: creating non-SWA KV cache, size = N cells`` and ``creating SWA
KV cache`` (src/llama-kv-cache-iswa.cpp). The MiB figures are ``(float)bytes /
(1024.0f*1024.0f)`` printed with ``%.2f``; ``mib_as_logged`` reproduces that rounding, float
precision included, so a planned byte count compares with the log to the last digit.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Decimal

import numpy as np

from harness.planning.kv import CacheRole, KvCachePlan, KvPlan

_SIZE_LINE = re.compile(
    r"llama_kv_cache: size =\s*(?P<size>\d+\.\d+) MiB \(\s*(?P<cells>\d+) cells,"
    r"\s*(?P<layers>\d+) layers,\s*(?P<seqs>\d+)/(?P<streams>\d+) seqs\),"
    r" K \((?P<type_k>[^)]+)\):\s*(?P<k>\d+\.\d+) MiB,"
    r" V \((?P<type_v>[^)]+)\):\s*(?P<v>\d+\.\d+) MiB"
)
_ISWA_LINE = re.compile(r"llama_kv_cache_iswa: creating\s+(?P<which>non-SWA|SWA) KV cache")
_ROLES = {"non-SWA": CacheRole.NON_SWA, "SWA": CacheRole.SWA}


@dataclass(frozen=True)
class KvLogLine:
    """One ``llama_kv_cache: size = …`` line; MiB values exactly as printed."""

    role: CacheRole
    size_mib: Decimal
    cells: int
    layers: int
    n_seq_max: int
    n_stream: int
    type_k: str
    k_mib: Decimal
    type_v: str
    v_mib: Decimal


def parse_kv_cache_lines(log: str) -> tuple[KvLogLine, ...]:
    """Every KV-cache size line in ``log``, in order; a role from the iswa line before it."""
    found: list[KvLogLine] = []
    pending: CacheRole | None = None
    for line in log.splitlines():
        announced = _ISWA_LINE.search(line)
        if announced is not None:
            pending = _ROLES[announced["which"]]
            continue
        match = _SIZE_LINE.search(line)
        if match is None:
            continue
        found.append(KvLogLine(
            role=pending or CacheRole.KV,
            size_mib=Decimal(match["size"]),
            cells=int(match["cells"]),
            layers=int(match["layers"]),
            n_seq_max=int(match["seqs"]),
            n_stream=int(match["streams"]),
            type_k=match["type_k"],
            k_mib=Decimal(match["k"]),
            type_v=match["type_v"],
            v_mib=Decimal(match["v"]),
        ))
        pending = None
    return tuple(found)


def mib_as_logged(n_bytes: int) -> Decimal:
    """``%.2f`` of ``(float)n_bytes / (1024.0f * 1024.0f)``, in single precision like the C."""
    value = np.float32(n_bytes) / np.float32(1024.0 * 1024.0)
    return Decimal(f"{float(value):.2f}")


def check_kv_plan(plan: KvPlan, lines: Sequence[KvLogLine]) -> str | None:
    """None when the log's cache lines are exactly the planned caches, else what differs."""
    if len(lines) != len(plan.caches):
        return (f"planned {len(plan.caches)} KV cache(s) "
                f"({', '.join(c.role.value for c in plan.caches) or 'none'}), the log shows "
                f"{len(lines)} ({', '.join(line.role.value for line in lines) or 'none'})")
    problems = [problem for cache, line in zip(plan.caches, lines, strict=True)
                if (problem := _check_cache(cache, line)) is not None]
    return "; ".join(problems) or None


def _check_cache(cache: KvCachePlan, line: KvLogLine) -> str | None:
    planned = (cache.role, cache.cells, cache.layers, cache.n_seq_max, cache.n_stream,
               cache.type_k, mib_as_logged(cache.k_bytes), cache.type_v,
               mib_as_logged(cache.v_bytes), mib_as_logged(cache.total_bytes))
    logged = (line.role, line.cells, line.layers, line.n_seq_max, line.n_stream, line.type_k,
              line.k_mib, line.type_v, line.v_mib, line.size_mib)
    names = ("role", "cells", "layers", "n_seq_max", "n_stream", "K type", "K MiB", "V type",
             "V MiB", "size MiB")
    diffs = [f"{name} planned {want} logged {got}"
             for name, want, got in zip(names, planned, logged, strict=True) if want != got]
    if not diffs:
        return None
    return f"{cache.role.value} cache: " + ", ".join(diffs)
