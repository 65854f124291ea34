"""This host's memory read bandwidth, measured once and cached, and its last-level cache.

The decode prediction (harness/planning/decode_speed.py) divides the bytes a token reads
from host memory by this bandwidth. It is measured the way decode reads weights: every
core streams through its own slice of a buffer far larger than the last-level cache
(numpy's sum releases the GIL, so threads read in parallel), and the best of a few
passes counts. The figure is cached per host (``$HARNESS_CACHE/host-memory.json``, keyed
by host name, CPU model and memory size), since a pass takes a second or two and the
hardware does not change between runs.
"""

from __future__ import annotations

import json
import os
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from harness.files import write_json_atomic
from harness.planning.decode_speed import HostBandwidth
from harness.probes.hardware import cpu_model

CACHE_NAME = "host-memory.json"
#: The buffer streamed through: 16x the 32 MiB last-level cache measured here, so the
#: passes read memory, not cache.
BUFFER_BYTES = 512 * 1024 * 1024
PASSES = 5
_LLC = Path("/sys/devices/system/cpu/cpu0/cache")


@dataclass(frozen=True)
class HostMemory:
    """One host's measured read bandwidth and what it is keyed by."""

    host: str
    cpu: str
    mem_total_bytes: int
    read_gbps: float
    threads: int
    measured_at: str
    #: The largest CPU cache (bytes), 0 when the kernel does not say.
    last_level_cache_bytes: int

    def bandwidth(self) -> HostBandwidth:
        """The figure as the decode prediction takes it, saying where it came from."""
        return HostBandwidth(self.read_gbps, f"measured on {self.host} {self.measured_at}",
                             self.last_level_cache_bytes)

    def same_host(self, other: HostMemory) -> bool:
        return (self.host, self.cpu, self.mem_total_bytes) == (
            other.host, other.cpu, other.mem_total_bytes)


def host_memory(cache: Path) -> HostMemory:
    """The cached measurement for this host, else a fresh one (then cached)."""
    here = _identity()
    path = cache / CACHE_NAME
    known = _read_cached(path)
    if known is not None and known.same_host(here):
        return known
    measured = HostMemory(**{**asdict(here), "read_gbps": measure_read_gbps(),
                             "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                          time.gmtime())})
    write_json_atomic(path, asdict(measured))
    return measured


def measure_read_gbps(buffer_bytes: int = BUFFER_BYTES, passes: int = PASSES,
                      threads: int | None = None) -> float:
    """GB/s (1e9 bytes) read by ``threads`` cores summing their slices; the best pass."""
    workers = threads or os.cpu_count() or 1
    data = np.ones(buffer_bytes // 8, dtype=np.float64)
    slices = np.array_split(data, workers)
    best = 0.0
    with ThreadPoolExecutor(max_workers=workers) as pool:
        list(pool.map(np.sum, slices))  # fault the pages in before timing
        for _ in range(passes):
            started = time.perf_counter()
            list(pool.map(np.sum, slices))
            took = time.perf_counter() - started
            best = max(best, data.nbytes / took / 1e9)
    return best


def last_level_cache_bytes(cache_dir: Path = _LLC) -> int:
    """The largest cache the kernel lists for cpu0 (``index*/size``, e.g. ``32768K``)."""
    sizes = []
    for entry in cache_dir.glob("index*/size"):
        try:
            text = entry.read_text().strip()
        except OSError:
            continue
        scale = {"K": 1024, "M": 1024 * 1024}.get(text[-1:], 1)
        digits = text.rstrip("KM")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes, default=0)


def _read_cached(path: Path) -> HostMemory | None:
    """The cached figure, or None when it is missing, damaged or not a measurement (the
    file is the harness's own, so anything odd is measured again rather than trusted)."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    types = {"host": str, "cpu": str, "mem_total_bytes": int, "read_gbps": float,
             "threads": int, "measured_at": str, "last_level_cache_bytes": int}
    if not isinstance(data, dict) or set(data) != set(types):
        return None
    if not all(isinstance(data[k], kind) and not isinstance(data[k], bool)
               for k, kind in types.items()):
        return None
    if not 0 < data["read_gbps"] < 1e5:
        return None
    return HostMemory(**data)


def _identity() -> HostMemory:
    try:
        mem_total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        mem_total = 0
    return HostMemory(host=socket.gethostname(), cpu=cpu_model(), mem_total_bytes=mem_total,
                      read_gbps=0.0, threads=os.cpu_count() or 1, measured_at="",
                      last_level_cache_bytes=last_level_cache_bytes())
