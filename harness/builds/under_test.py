"""Which build a test run gates: a build key, a ``build.json``, or a binary path.

``--harness-build`` / ``HARNESS_BUILD`` names it; without it the run uses
``--harness-server-bin`` / ``HARNESS_SERVER_BIN`` or builds the pinned source for the
CPU. A binary with no ``build.json`` beside it is tested without recorded capabilities.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.builds.native import BuildResult, builds_dir, read_build_info
from harness.errors import ConfigError
from harness.facts.build import Backend, BuildInfo


@dataclass(frozen=True)
class BuildUnderTest:
    binary: Path
    info: BuildInfo | None

    @property
    def backend(self) -> Backend:
        return self.info.backend if self.info else Backend.CPU

    @property
    def key(self) -> str:
        return self.info.key if self.info else f"binary:{self.binary}"


def run_image(build: BuildUnderTest, runner: str, named_image: str | None) -> str | None:
    """The image a run's servers start in, when known without building one: a container
    run's ``--harness-image``, else the build's own image; None for a subprocess run."""
    if runner != "container":
        return None
    if named_image:
        return named_image
    return build.info.image if build.info is not None else None


def from_result(result: BuildResult) -> BuildUnderTest:
    return BuildUnderTest(binary=result.binary, info=result.info)


def resolve_named_build(name: str, cache: Path) -> BuildUnderTest:
    """``name`` is a build.json, a llama-server binary, or a build key in the cache."""
    path = Path(name).expanduser()
    if path.suffix == ".json" and path.is_file():
        info = read_build_info(path)
        return BuildUnderTest(Path(info.binary), info)
    if path.is_file():
        if not os.access(path, os.X_OK):
            raise ConfigError(f"--harness-build {name}: the file is not executable")
        record = path.parent.parent / "build.json"
        return BuildUnderTest(path, read_build_info(record) if record.is_file() else None)
    record = builds_dir(cache) / name / "build.json"
    if record.is_file():
        info = read_build_info(record)
        return BuildUnderTest(Path(info.binary), info)
    known = sorted(p.parent.name for p in builds_dir(cache).glob("*/build.json"))
    raise ConfigError(
        f"--harness-build {name!r} is neither a build.json, a llama-server binary nor a build "
        f"key in {builds_dir(cache)}; known keys: {', '.join(known) or 'none'}")
