"""Start-to-ready of the dense fixture in a container against as a child process.

Both go through the harness (same readiness: port, /health, one completion), interleaved,
and the script prints both medians and their ratio. Needs a Docker engine and the CPU
image (`harness build --backend cpu --container`, built here if missing).

    .venv/bin/python benchmarks/container_overhead.py [--runs 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import modelgen
from harness.builds.container_build import build_image
from harness.builds.resolve import ensure_build, resolve_source
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.probes.docker_engine import docker_engine
from harness.runners.container_runner import ContainerRunner
from harness.runners.subprocess_runner import SubprocessRunner


def timed_start(runner: SubprocessRunner | ContainerRunner, spec: LaunchSpec) -> float:
    started = time.perf_counter()
    server = runner.start(spec)
    elapsed = time.perf_counter() - started
    server.stop()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    cache = cache_root()
    binary = ensure_build(cache, BuildRequest()).binary
    image = build_image(docker_engine(), cache, resolve_source(cache, None),
                        BuildRequest()).info.image
    assert image is not None
    spec = LaunchSpec(model=modelgen.ensure_fixtures().model("dense"), ctx_size=512)
    with tempfile.TemporaryDirectory(prefix="harness-bench-") as tmp:
        native = SubprocessRunner(binary, Path(tmp) / "native")
        container = ContainerRunner(image, Path(tmp) / "container")
        native_s: list[float] = []
        container_s: list[float] = []
        for _ in range(args.runs):
            native_s.append(timed_start(native, spec))
            container_s.append(timed_start(container, spec))
    n, c = statistics.median(native_s), statistics.median(container_s)
    print(f"runs: {args.runs} each, interleaved; image {image}")
    print(f"subprocess start-to-ready median: {n * 1000:.1f} ms")
    print(f"container  start-to-ready median: {c * 1000:.1f} ms")
    print(f"ratio container/subprocess: {c / n:.2f}")


if __name__ == "__main__":
    main()
