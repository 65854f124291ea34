"""Which build a test run gates: a build key, a ``build.json``, or a binary path.

``--harness-build`` / ``HARNESS_BUILD`` names it; without it the run uses
``--harness-server-bin`` / ``HARNESS_SERVER_BIN`` or builds the pinned source for the
CPU. A binary with no ``build.json`` beside it (a fork built by its own CI, a binary
carried to a GPU machine) is asked at session start, as ``harness build`` asks what it
built: ``--help`` for its capabilities, ``--version``, and ``--list-devices`` with
``--version`` for its backend; its key is made from its content hash. An executable
RPC server beside it (``ggml-rpc-server``, or ``rpc-server`` in older trees) is its RPC
server when its help lists ``--rpc``, as ``harness build --rpc`` records one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.builds.capabilities import bare_binary_info
from harness.builds.native import (
    RPC_SERVER_FILE,
    BuildResult,
    builds_dir,
    read_build_info,
    server_output,
)
from harness.errors import ConfigError
from harness.facts.build import Backend, BuildInfo
from harness.files import sha256_file
from harness.probes.devices import infer_backend, run_list_devices

#: The RPC server's file names beside a bare binary, in the order looked for: the name
#: ``harness build --rpc`` gives it (the target's at the pin), then the older target's.
RPC_SERVER_NAMES = (RPC_SERVER_FILE, "rpc-server")


@dataclass(frozen=True)
class BuildUnderTest:
    binary: Path
    info: BuildInfo | None
    #: True when ``info`` was read from the binary itself (no ``build.json`` recorded it).
    probed: bool = False

    @property
    def backend(self) -> Backend:
        return self.info.backend if self.info else Backend.CPU

    @property
    def key(self) -> str:
        return self.info.key if self.info else f"binary:{self.binary}"

    @property
    def release(self) -> int | None:
        """The llama.cpp release number of the build, None when nothing names it."""
        return self.info.release.number if self.info else None


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


def resolve_named_build(name: str, cache: Path,
                        option: str = "--harness-build") -> BuildUnderTest:
    """``name`` is a build.json, a llama-server binary, or a build key in the cache.

    ``option`` is the option that named it, for the messages.
    """
    path = Path(name).expanduser()
    if path.suffix == ".json" and path.is_file():
        info = read_build_info(path)
        return BuildUnderTest(Path(info.binary), info)
    if path.is_file():
        if not os.access(path, os.X_OK):
            raise ConfigError(f"{option} {name}: the file is not executable; "
                              f"`chmod +x {name}`, or name a llama-server binary")
        record = path.parent.parent / "build.json"
        if record.is_file():
            return BuildUnderTest(path, read_build_info(record))
        return BuildUnderTest(path, probe_binary(path, option), probed=True)
    record = builds_dir(cache) / name / "build.json"
    if record.is_file():
        info = read_build_info(record)
        return BuildUnderTest(Path(info.binary), info)
    known = sorted(p.parent.name for p in builds_dir(cache).glob("*/build.json"))
    raise ConfigError(
        f"{option} {name!r} is neither a build.json, a llama-server binary nor a build "
        f"key in {builds_dir(cache)}; known keys: {', '.join(known) or 'none'}")


def probe_binary(binary: Path, option: str = "--harness-build") -> BuildInfo:
    """The record of a binary with no ``build.json``, from its own ``--help``,
    ``--version`` and ``--list-devices``, and the RPC server beside it
    (:func:`rpc_server_beside`); ConfigError when ``--help`` fails.

    A ``--help`` that succeeds but lists none of llama-server's options gives empty
    capabilities, which the planner reads as "not known" (it then trusts the plan).
    """
    code, help_text = server_output(binary, "--help")
    if code != 0:
        said = f"did not run ({help_text})" if code is None else f"exited {code}"
        raise ConfigError(
            f"{option} {binary}: `{binary} --help` {said}, so what the server accepts cannot "
            f"be read:\n{help_text[-1500:] if code is not None else ''}\nName a llama-server "
            f"binary that runs on this machine (check `{binary} --help`, and `ldd {binary}` "
            "for missing libraries), or its build.json / build key instead")
    version_code, version = server_output(binary, "--version")
    listing = run_list_devices(binary)
    backend = infer_backend(listing.devices(), listing.stdout, listing.stderr,
                            version if version_code is not None else "")
    rpc_server = rpc_server_beside(binary)
    return bare_binary_info(binary=str(binary), sha256=sha256_file(binary), backend=backend,
                            version=version if version_code == 0 else "", help_text=help_text,
                            rpc_server=str(rpc_server) if rpc_server else None)


def rpc_server_beside(binary: Path) -> Path | None:
    """The executable RPC server in the binary's folder, by :data:`RPC_SERVER_NAMES`;
    None when there is none."""
    for name in RPC_SERVER_NAMES:
        candidate = binary.parent / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    return None
