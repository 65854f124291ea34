"""What ``harness build`` and ``harness run`` share: the build with a progress bar.

Not a command (its name starts with ``_``, so the package does not list it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from harness.builds.container_build import build_image
from harness.builds.native import BuildResult, ProgressCallback
from harness.builds.resolve import ensure_build, resolve_source
from harness.facts.build import BuildInfo
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.probes.docker_engine import docker_engine

console = Console(stderr=True)


def build_image_with_progress(request: BuildRequest, source: Path | None,
                               bases: dict[str, str]) -> BuildInfo:
    cache = cache_root()
    client = docker_engine()
    started = time.monotonic()
    with progress_bar(request) as report:
        result = build_image(client, cache, resolve_source(cache, source), request,
                             bases=bases or None, progress=report)
    took = time.monotonic() - started
    state = "cache hit" if result.cache_hit else f"built in {result.info.build_seconds:.0f}s"
    console.print(f"[bold]image[/] {result.info.image} ({state}, {took:.2f}s)", soft_wrap=True)
    return result.info


def build_with_progress(request: BuildRequest, source: Path | None) -> BuildResult:
    cache = cache_root()
    started = time.monotonic()
    with progress_bar(request) as report:
        result = ensure_build(cache, request, source, progress=report)
    took = time.monotonic() - started
    state = "cache hit" if result.cache_hit else f"built in {result.info.build_seconds:.0f}s"
    console.print(f"[bold]llama-server[/] {result.info.binary} ({state}, {took:.2f}s)",
                  soft_wrap=True)
    return result


@contextlib.contextmanager
def progress_bar(request: BuildRequest) -> Iterator[ProgressCallback]:
    """A live bar on a terminal; in a CI log, a line every tenth of the way."""
    with Progress(TextColumn("[bold]build[/] {task.description}"), BarColumn(),
                  TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"llama-server ({request.backend.value})", total=1.0)
        next_decile = 0.1

        def report(fraction: float | None, line: str) -> None:
            nonlocal next_decile
            if fraction is None:
                return
            progress.update(task, completed=fraction)
            if not console.is_terminal and fraction >= next_decile:
                console.print(f"build {request.backend.value}: {fraction:.0%}", soft_wrap=True)
                next_decile = int(fraction * 10) / 10 + 0.1

        yield report
