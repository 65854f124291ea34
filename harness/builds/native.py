"""Native CMake builds of llama-server into the content-addressed build cache.

``$HARNESS_CACHE/builds/<key>/`` holds ``bin/llama-server``, ``build.log``,
``build.json`` and the CMake tree. A directory with a ``build.json`` is complete: asking
for the same key again returns it without running CMake. Concurrent callers (xdist
workers) serialise on one file lock per key, so a build runs once.

A CUDA build finds its toolkit itself (``harness/probes/cuda_toolkit.py``: nvcc on PATH or
in /usr/local/cuda, cuBLAS from the toolkit or the ``nvidia-cublas`` wheel, libcuda) and
hands CMake where each is; the key hashes nvcc's version and path and the cuBLAS used.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from harness.bounded import bounded_lock, run_step
from harness.builds.capabilities import parse_capabilities
from harness.builds.compiler_cache import (
    NO_CCACHE_FLAG,
    CompilerCache,
    compiler_cache,
    linked_source,
)
from harness.builds.source import SourceTree
from harness.data_schema import load_json, schema_file
from harness.errors import BuildError
from harness.facts.build import Backend, BuildInfo
from harness.facts.cuda_toolkit import CudaToolkit
from harness.files import write_json_atomic
from harness.planning.build_plan import (
    SERVER_TARGET,
    BuildRequest,
    build_argv,
    build_key,
    configure_argv,
    cuda_toolkit_flags,
    rpc_server_target,
    wants_rpc_server,
)
from harness.probes.cuda_toolkit import require_cuda_toolkit
from harness.probes.toolchain import Toolchain, find_toolchain

#: What a build.json holds: BuildInfo.to_json's shape.
BUILD_SCHEMA = schema_file("build")
LOG_TAIL_LINES = 40
#: Seconds CMake's configure step may take (tens of seconds here; minutes where CUDA's
#: compiler is probed on a slow disk).
CONFIGURE_LIMIT_S = 1800.0
#: Seconds ``cmake --build`` may take: about 6 minutes for the CPU server on 2 cores,
#: an hour or more for CUDA or ROCm with every architecture. Generous, but finite.
COMPILE_LIMIT_S = 4 * 3600.0
#: Seconds a caller waits for another process building the same key: its whole build,
#: which that process gives up on by then, plus the version and --help probes.
BUILD_LOCK_WAIT_S = CONFIGURE_LIMIT_S + COMPILE_LIMIT_S + 300.0
_PERCENT = re.compile(r"^\[\s*(\d+)%\]")
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")

#: Receives (fraction done 0..1, latest line); the CLI draws a progress bar from it.
ProgressCallback = Callable[[float | None, str], None]


@dataclass(frozen=True)
class BuildResult:
    info: BuildInfo
    directory: Path
    cache_hit: bool

    @property
    def binary(self) -> Path:
        return Path(self.info.binary)


def builds_dir(cache: Path) -> Path:
    return cache / "builds"


def cached_build(cache: Path, source: SourceTree, request: BuildRequest,
                 compiler: str) -> BuildResult | None:
    """The finished build for these inputs, if the cache has one."""
    directory = builds_dir(cache) / build_key(source.digest, request, compiler)
    return _load_finished(directory)


def finished_build(cache: Path, digest: str, request: BuildRequest) -> BuildResult | None:
    """The finished build of a tree with ``digest`` on this host's tools, if the cache
    has one: :func:`build_server`'s cache hit, without the tree at hand."""
    key = build_key(digest, request, native_toolchain(request).compiler)
    return _load_finished(builds_dir(cache) / key)


@dataclass(frozen=True)
class NativeToolchain:
    """The tools a native build of one request runs with, and how the key names them."""

    toolchain: Toolchain
    #: -D entries that point CMake at this host's toolkit (CUDA: nvcc, cuBLAS, libcuda).
    flags: tuple[str, ...] = ()
    #: The compiler identity the build key hashes and ``build.json`` records.
    compiler: str = ""


def native_toolchain(request: BuildRequest, toolchain: Toolchain | None = None,
                     cuda: CudaToolkit | None = None) -> NativeToolchain:
    """Find what a native build of ``request`` needs; ToolMissingError names what is not
    here and how to get it (nvcc, cuBLAS and libcuda for CUDA)."""
    if request.backend is not Backend.CUDA:
        found = toolchain or find_toolchain(request.backend)
        return NativeToolchain(found, (), found.compiler)
    # nvcc is looked for here, not only on PATH: NVIDIA's installer leaves it in
    # /usr/local/cuda/bin.
    found = toolchain or find_toolchain(Backend.CPU)
    cuda = cuda or require_cuda_toolkit()
    return NativeToolchain(found, cuda_toolkit_flags(cuda, request),
                           f"{found.compiler}; {cuda.describe()}")


def build_server(
    cache: Path,
    source: SourceTree,
    request: BuildRequest,
    *,
    jobs: int | None = None,
    progress: ProgressCallback | None = None,
    toolchain: Toolchain | None = None,
) -> BuildResult:
    """Return the cached build for these inputs, building it first if needed."""
    tools = native_toolchain(request, toolchain)
    key = build_key(source.digest, request, tools.compiler)
    directory = builds_dir(cache) / key
    hit = _load_finished(directory)
    if hit:
        return hit
    directory.mkdir(parents=True, exist_ok=True)
    with bounded_lock(Path(str(directory) + ".lock"), wait_s=BUILD_LOCK_WAIT_S,
                      purpose=f"building {request.backend.value} llama-server {key}",
                      error=BuildError, setting="harness.builds.native.BUILD_LOCK_WAIT_S"):
        # Another worker may have finished while this one waited on the lock.
        hit = _load_finished(directory)
        if hit:
            return hit
        started = time.monotonic()
        binary = _compile(directory, source, request, tools, compiler_cache(cache),
                          jobs=jobs or os.cpu_count() or 1, progress=progress)
        rpc_server = _rpc_server_beside(binary) if wants_rpc_server(
            request.cmake_flags()) else None
        info = BuildInfo(
            key=key,
            backend=request.backend,
            binary=str(binary),
            version=_server_output(binary, "--version"),
            source_digest=source.digest,
            source_origin=source.origin,
            cmake_flags=request.cmake_flags(),
            compiler=tools.compiler,
            build_seconds=round(time.monotonic() - started, 1),
            capabilities=parse_capabilities(_server_output(binary, "--help")),
            rpc_server=str(rpc_server) if rpc_server else None,
        )
        write_json_atomic(directory / "build.json", info.to_json())
        return BuildResult(info=info, directory=directory, cache_hit=False)


def _load_finished(directory: Path) -> BuildResult | None:
    record = directory / "build.json"
    if not record.is_file():
        return None
    try:
        info = read_build_info(record)
    except BuildError:
        return None  # an unreadable record is treated as no build: it gets rebuilt
    if not Path(info.binary).is_file():
        return None
    return BuildResult(info=info, directory=directory, cache_hit=True)


def read_build_info(record: Path) -> BuildInfo:
    """A ``build.json``; BuildError when it is unreadable or not a build record."""
    data = load_json(record, BUILD_SCHEMA, BuildError,
                     fix=f"{record} is not a build record the harness wrote: delete it and "
                         "build again (`harness build`)")
    return BuildInfo.from_json(data)


def configure_tree(tree: Path, source: SourceTree, request: BuildRequest,
                   tools: NativeToolchain, log_path: Path) -> list[str]:
    """Run only CMake's configure (and generate) step of ``request`` into ``tree``, logged
    to ``log_path``; returns the argv. BuildError with the log's tail when it fails."""
    _drop_stale_tree(tree, tools.toolchain.generator, source.path)
    argv = configure_argv(tools.toolchain.cmake, str(source.path), str(tree),
                          tools.toolchain.generator, request, toolchain_flags=tools.flags)
    with log_path.open("w", encoding="utf-8", buffering=1) as log:
        log.write("$ " + " ".join(argv) + "\n")
        log.flush()
        _run_logged(argv, log, log_path, None)
    return argv


def _compile(directory: Path, source: SourceTree, request: BuildRequest,
             tools: NativeToolchain, ccache: CompilerCache | None, *, jobs: int,
             progress: ProgressCallback | None) -> Path:
    tree = directory / "cmake-build"
    if ccache is None:
        cmake_source, flags, env = source.path, (*tools.flags, NO_CCACHE_FLAG), None
    else:
        # The same relative path to the source from every build: hits across trees.
        cmake_source = linked_source(directory, source.path)
        flags = (*tools.flags, *ccache.cmake_flags(request.backend))
        env = ccache.environment(os.environ)
    _drop_stale_tree(tree, tools.toolchain.generator, cmake_source)
    log_path = directory / "build.log"
    targets = (SERVER_TARGET, *_rpc_targets(source.path, request))
    steps = [
        (configure_argv(tools.toolchain.cmake, str(cmake_source), str(tree),
                        tools.toolchain.generator, request, toolchain_flags=flags), False),
        (build_argv(tools.toolchain.cmake, str(tree), jobs, targets), True),
    ]
    # Line-buffered so `tail -f build.log` follows a running build.
    with log_path.open("w", encoding="utf-8", buffering=1) as log:
        for argv, compiling in steps:
            log.write("$ " + " ".join(argv) + "\n")
            log.flush()
            _run_logged(argv, log, log_path, progress, env, compiling=compiling)
    built = tree / "bin" / SERVER_TARGET
    if not built.is_file():
        raise BuildError(f"the build finished but {built} is missing; see {log_path}")
    binary = directory / "bin" / SERVER_TARGET
    binary.parent.mkdir(exist_ok=True)
    shutil.copy2(built, binary)
    for target in targets[1:]:
        # Copied under the one name the harness looks for, whatever the tree called it.
        extra = tree / "bin" / target
        if not extra.is_file():
            raise BuildError(f"the build finished but {extra} is missing; see {log_path}")
        shutil.copy2(extra, directory / "bin" / RPC_SERVER_FILE)
    return binary


#: The RPC server's file name in a build's ``bin/``.
RPC_SERVER_FILE = "ggml-rpc-server"
#: Where llama.cpp keeps the RPC server: tools/ at the pin, examples/ in older trees.
_RPC_DIRS = ("tools/rpc", "examples/rpc")


def _rpc_targets(source: Path, request: BuildRequest) -> tuple[str, ...]:
    """The RPC server's target when the request turns the RPC backend on."""
    if not wants_rpc_server(request.cmake_flags()):
        return ()
    for folder in _RPC_DIRS:
        lists = source / folder / "CMakeLists.txt"
        if lists.is_file():
            return (rpc_server_target(lists.read_text(errors="replace")),)
    raise BuildError(f"{source} has no RPC server ({' or '.join(_RPC_DIRS)}/CMakeLists.txt): "
                     "this tree cannot build one; build it without --rpc")


def _rpc_server_beside(binary: Path) -> Path:
    return binary.parent / RPC_SERVER_FILE


def _run_logged(argv: list[str], log: TextIO, log_path: Path,
                progress: ProgressCallback | None, env: dict[str, str] | None = None, *,
                compiling: bool = False) -> None:
    """One CMake step, its output into ``log`` and ``progress``, within its limit
    (``cmake --build``'s when ``compiling``, else the configure's); BuildError with the
    log's tail when it fails or overruns."""
    def line_out(line: str) -> None:
        log.write(line + "\n")
        if progress:
            progress(progress_fraction(line), line.strip())

    limit, setting = ((COMPILE_LIMIT_S, "harness.builds.native.COMPILE_LIMIT_S") if compiling
                      else (CONFIGURE_LIMIT_S, "harness.builds.native.CONFIGURE_LIMIT_S"))
    run = run_step(argv, step=f"`{' '.join(argv[:2])} ...`", limit_s=limit, setting=setting,
                   error=BuildError, log_path=log_path, on_line=line_out, env=env)
    if run.code != 0:
        lines = "\n".join(run.tail)
        raise BuildError(
            f"`{' '.join(argv[:2])} ...` failed with exit code {run.code}.\n"
            f"--- last {LOG_TAIL_LINES} lines of the build log ---\n{lines}\n"
            f"--- full log: {log_path} ---"
        )


def progress_fraction(line: str) -> float | None:
    """How far a CMake (make or ninja) build is from one line of its output, if it says."""
    if match := _PERCENT.match(line):
        return int(match.group(1)) / 100
    if match := _NINJA_STEP.match(line):
        return int(match.group(1)) / max(1, int(match.group(2)))
    return None


def _drop_stale_tree(tree: Path, generator: str, source: Path) -> None:
    # CMake refuses to reuse a tree configured with another generator (make vs ninja) or
    # from another source path (a build left half done before or after a compiler cache).
    cache_file = tree / "CMakeCache.txt"
    if not cache_file.is_file():
        return
    text = cache_file.read_text(errors="replace")
    if (f"CMAKE_GENERATOR:INTERNAL={generator}\n" not in text
            or f"CMAKE_HOME_DIRECTORY:INTERNAL={source}\n" not in text):
        shutil.rmtree(tree)


def server_output(binary: Path, flag: str) -> tuple[int | None, str]:
    """``binary flag``'s exit code and output; None and the reason when it cannot run."""
    try:
        proc = subprocess.run([str(binary), flag], capture_output=True, text=True, timeout=60,
                              check=False, errors="replace")
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, str(exc)
    # llama-server prints --version on stderr and --help on stdout.
    return proc.returncode, (proc.stdout + proc.stderr).strip()


def _server_output(binary: Path, flag: str) -> str:
    code, text = server_output(binary, flag)
    if code is None:
        raise BuildError(f"the built {binary} does not run `{flag}`: {text}")
    if code != 0 or not text:
        raise BuildError(
            f"the built {binary} failed `{flag}` with exit code {code}:\n{text[-2000:]}"
        )
    return text
