"""The exact build a recorded failure ran: found in the cache, or rebuilt from its source.

A run's ``environment.properties`` names the build by source digest, backend, CMake
flags and key (and, for a container run, the image and its id). ``harness repro`` reuses
a cached build with the same inputs, and builds one only when the source with that
digest is at hand: the pinned source, or a ``--source`` tree that hashes to it. Anything
else would test a different llama-server than the one that failed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from harness.builds.container_build import BUILD_LABEL
from harness.builds.native import (
    BuildResult,
    ProgressCallback,
    build_server,
    builds_dir,
    read_build_info,
)
from harness.builds.resolve import resolve_source
from harness.builds.source import load_manifest, local_source
from harness.errors import BuildError, ConfigError
from harness.facts.build import Backend, BuildInfo
from harness.planning.build_plan import RPC_SWITCH, BuildRequest
from harness.repro.properties import recorded_cmake_flags
from harness.repro.repro_error import ReproError


@dataclass(frozen=True)
class RecordedBuild:
    """The build a run tested, as its ``environment.properties`` names it."""

    backend: Backend
    source_digest: str
    key: str
    #: None for a run recorded before the flags were.
    cmake_flags: tuple[str, ...] | None
    #: Container runs: the image servers ran in, and the engine's id of it.
    image: str | None = None
    image_id: str | None = None

    @classmethod
    def from_properties(cls, props: dict[str, str], origin: str) -> RecordedBuild:
        missing = [k for k in ("build.backend", "build.source_digest", "build.key")
                   if k not in props]
        if missing:
            raise ReproError(
                f"{origin} names no build ({', '.join(missing)} missing from its "
                "environment.properties): the session that wrote it never resolved a build, "
                "so there is nothing to rebuild; reproduce it with plain pytest")
        try:
            backend = Backend(props["build.backend"])
        except ValueError:
            raise ReproError(f"{origin}: build.backend {props['build.backend']!r} is not one "
                             f"of {', '.join(b.value for b in Backend)}") from None
        try:
            flags = recorded_cmake_flags(props)
        except ConfigError as exc:
            raise ReproError(f"{origin}: {exc}") from exc
        return cls(backend=backend, source_digest=props["build.source_digest"],
                   key=props["build.key"], cmake_flags=flags, image=props.get("build.image"),
                   image_id=props.get("build.image_digest"))

    @property
    def flags_or_default(self) -> tuple[str, ...]:
        """The recorded flags; before they were recorded, every run built the defaults."""
        return self.cmake_flags or BuildRequest(backend=self.backend).cmake_flags()

    def describe(self) -> str:
        return (f"{self.backend.value} build {self.key} of source {self.source_digest[:16]}"
                + (f" (image {self.image})" if self.image else ""))


def request_from_flags(backend: Backend, flags: tuple[str, ...]) -> BuildRequest:
    """The ``BuildRequest`` whose ``cmake_flags()`` are exactly ``flags`` (inverse, pure)."""
    native = "-DGGML_NATIVE=ON" in flags
    base = BuildRequest(backend=backend, native=native).cmake_flags()
    if flags[:len(base)] != base:
        raise ReproError(
            f"the recorded CMake flags {' '.join(flags)} do not start with the flags "
            f"`harness build --backend {backend.value}` always passes ({' '.join(base)}); "
            "the build was made by another tool: build it that way and pass the binary with "
            "--harness-server-bin to pytest yourself")
    rest = flags[len(base):]
    # --rpc's switch comes right after the backend's own flags (BuildRequest.cmake_flags).
    rpc = bool(rest) and rest[0] == RPC_SWITCH
    return BuildRequest(backend=backend, native=native, rpc=rpc,
                        extra_cmake_args=rest[1:] if rpc else rest)


def build_command(recorded: RecordedBuild, source: str = "PATH") -> str:
    """The ``harness build`` line that makes this build from the tree at ``source``."""
    request = request_from_flags(recorded.backend, recorded.flags_or_default)
    if recorded.image and request.rpc:
        # An image carries no RPC server (`--rpc --container` is refused): the switch alone.
        request = replace(request, rpc=False,
                          extra_cmake_args=(RPC_SWITCH, *request.extra_cmake_args))
    words = ["harness", "build", "--backend", recorded.backend.value, "--source", source]
    if request.native:
        words.append("--native")
    if request.rpc:
        words.append("--rpc")
    for arg in request.extra_cmake_args:
        words += ["--cmake-arg", arg]
    if recorded.image:
        words.append("--container")
    return " ".join(words)


def matches(info: BuildInfo, recorded: RecordedBuild) -> bool:
    """Whether a cached native build has the recorded source, backend and flags."""
    return (info.image is None and info.source_digest == recorded.source_digest
            and info.backend is recorded.backend
            and tuple(info.cmake_flags) == recorded.flags_or_default)


def find_cached_build(cache: Path, recorded: RecordedBuild) -> tuple[BuildInfo, Path] | None:
    """A finished native build of the recorded inputs: the recorded key first, then any
    with the same source, backend and flags (another compiler version keys differently)."""
    exact = builds_dir(cache) / recorded.key / "build.json"
    candidates = [exact, *sorted(p for p in builds_dir(cache).glob("*/build.json")
                                 if p != exact)]
    for record in candidates:
        if not record.is_file():
            continue
        try:
            info = read_build_info(record)
        except BuildError:
            continue  # a half-written or foreign record is no build
        if matches(info, recorded) and Path(info.binary).is_file():
            return info, record
    return None


def ensure_recorded_build(cache: Path, recorded: RecordedBuild, source: Path | None,
                          progress: ProgressCallback | None = None) -> tuple[BuildInfo, Path]:
    """The cached build of the recorded inputs, built now when its source is at hand."""
    found = find_cached_build(cache, recorded)
    if found is not None:
        return found
    request = request_from_flags(recorded.backend, recorded.flags_or_default)
    pinned = load_manifest().sha256
    if recorded.source_digest == pinned:
        result = build_server(cache, resolve_source(cache, None), request,
                              progress=progress)
        return result.info, _record_of(result)
    if source is not None:
        tree = local_source(source)
        if tree.digest == recorded.source_digest:
            result = build_server(cache, tree, request, progress=progress)
            return result.info, _record_of(result)
        given = f"; --source {source} hashes to {tree.digest}, not to it"
    else:
        given = ""
    raise ReproError(
        f"the failure ran a {recorded.backend.value} build of source {recorded.source_digest}, "
        f"which is not in the build cache {builds_dir(cache)} and is not the pinned source "
        f"({pinned}){given}. Build it from the llama.cpp tree with that digest: "
        f"`{build_command(recorded)}`, then run harness repro again (or pass that tree to "
        "harness repro --source PATH)")


def recorded_image(client: Any, recorded: RecordedBuild) -> BuildInfo:
    """A container run's image, by the engine id it had, and the build its label records."""
    assert recorded.image is not None
    wanted = recorded.image_id or recorded.image
    try:
        image = client.images.get(wanted)
    except Exception as exc:  # docker's ImageNotFound, or an engine that does not answer
        raise ReproError(
            f"the failure ran in image {recorded.image} (id {recorded.image_id or 'unknown'}), "
            f"which this Docker engine does not have ({type(exc).__name__}). Build the image "
            f"from the llama.cpp tree with source digest {recorded.source_digest}: "
            f"`{build_command(recorded)}`, and run the test with --harness-runner container "
            "--harness-image TAG (a rebuild gets a new id: its base images are part of it)"
        ) from exc
    label = (image.labels or {}).get(BUILD_LABEL)
    if not label:
        raise ReproError(f"image {wanted} has no {BUILD_LABEL} label: it was not made by "
                         "`harness build --container`; rebuild it with that command")
    return BuildInfo.from_json(json.loads(label))


def _record_of(result: BuildResult) -> Path:
    return result.directory / "build.json"
