"""Startup overhead of the harness's runner against a bare Popen + /health loop.

Starts the ``dense`` fixture N times each way, interleaved so machine noise hits both
alike, and prints the median time-to-ready of each and their ratio (target ≤ 1.10).
The harness's readiness does more than the bare loop (it also waits for a completion
that returns tokens), so the ratio bounds what that extra certainty costs.

    .venv/bin/python benchmarks/startup_overhead.py [--runs 20] [--server-bin PATH]
"""

from __future__ import annotations

import argparse
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

from harness import modelgen
from harness.builds.resolve import ensure_build
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners.launching import LOOPBACK
from harness.runners.subprocess_runner import SubprocessRunner

POLL_S = 0.02  # the same interval the harness's readiness wait polls at


def through_harness(runner: SubprocessRunner, spec: LaunchSpec) -> float:
    started = time.perf_counter()
    server = runner.start(spec)
    elapsed = time.perf_counter() - started
    server.stop()
    return elapsed


def bare(binary: Path, spec: LaunchSpec, log_dir: Path) -> float:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        port = int(sock.getsockname()[1])
    argv = spec.to_argv(str(binary), LOOPBACK, port)
    started = time.perf_counter()
    with (log_dir / f"bare-{port}.log").open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        with httpx.Client(timeout=2.0) as client:
            while True:
                try:
                    if client.get(f"http://{LOOPBACK}:{port}/health").status_code == 200:
                        return time.perf_counter() - started
                except httpx.TransportError:
                    pass
                if proc.poll() is not None:
                    raise RuntimeError(f"bare server exited with {proc.returncode}")
                time.sleep(POLL_S)
    finally:
        proc.terminate()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--server-bin", type=Path, default=None)
    args = parser.parse_args()
    binary = args.server_bin or ensure_build(cache_root(), BuildRequest()).binary
    spec = LaunchSpec(model=modelgen.ensure_fixtures().model("dense"), ctx_size=512)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        runner = SubprocessRunner(binary, Path(tmp))
        harness_s: list[float] = []
        bare_s: list[float] = []
        for _ in range(args.runs):
            harness_s.append(through_harness(runner, spec))
            bare_s.append(bare(binary, spec, Path(tmp)))
    h, b = statistics.median(harness_s), statistics.median(bare_s)
    print(f"runs: {args.runs} each, interleaved; binary {binary}")
    print(f"harness start-to-ready median: {h * 1000:.1f} ms "
          f"(min {min(harness_s) * 1000:.1f}, max {max(harness_s) * 1000:.1f})")
    print(f"bare Popen + /health median:   {b * 1000:.1f} ms "
          f"(min {min(bare_s) * 1000:.1f}, max {max(bare_s) * 1000:.1f})")
    print(f"ratio harness/bare: {h / b:.3f} (target <= 1.10)")


if __name__ == "__main__":
    main()
