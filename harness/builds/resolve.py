"""Which llama-server binary a run uses: an explicit one, or a (cached) native build.

``HARNESS_SERVER_BIN`` names a binary to use as it is (a build made elsewhere);
otherwise the pinned source, or ``HARNESS_SOURCE`` / ``--source``, is built for the CPU.
"""

from __future__ import annotations

from pathlib import Path

from harness.builds.native import BuildResult, ProgressCallback, build_server, cached_build
from harness.builds.source import SourceTree, fetch_pinned_source, load_manifest, local_source
from harness.planning.build_plan import BuildRequest
from harness.probes.toolchain import compiler_version


def resolve_source(cache: Path, source: Path | None) -> SourceTree:
    return local_source(source) if source else fetch_pinned_source(cache)


def ensure_build(cache: Path, request: BuildRequest, source: Path | None = None,
                 progress: ProgressCallback | None = None) -> BuildResult:
    """The build for ``request`` from ``source`` (the pin when None), built if missing."""
    return build_server(cache, resolve_source(cache, source), request, progress=progress)


def pinned_cpu_build(cache: Path, request: BuildRequest | None = None) -> BuildResult | None:
    """The cached build of the pinned source for ``request`` (default: the plain CPU
    build), if one exists (builds nothing)."""
    manifest = load_manifest()
    tree = SourceTree(path=cache / "source", digest=manifest.sha256,
                      origin=f"pypi:{manifest.requirement}")
    return cached_build(cache, tree, request or BuildRequest(), compiler_version())
