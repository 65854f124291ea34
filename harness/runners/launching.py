"""What every runner does the same way: defaults, the port line, log files, the launch.

A launch is the same few steps whatever starts the server: fill in the runner's default
``--threads``, build the argv, pick a log file no other server of this process uses,
start the thing (the one step each runner does its own way: ``spawn``), track it so exit
stops it, and tell the observers. ``start`` is then that launch plus the readiness wait.
Keeping the steps here means the runners cannot drift apart in them.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from harness.planning.launch import LaunchSpec
from harness.runners.base import RunningServer, ServerRunner
from harness.runners.live import track
from harness.runners.observe import notify_launched
from harness.runners.readiness import ready_or_stopped

#: Seconds a server may take from launch to ready, for every runner unless it is given
#: another (``--harness-ready-timeout`` / ``HARNESS_READY_TIMEOUT``). Generous: a tiny
#: model loads in a second or two, but a loaded CI machine (xdist workers sharing the
#: cores, a container start, a GPU backend initialising) can take far longer, and what
#: the deadline is there to catch is a hung load, not a slow one.
DEFAULT_READY_TIMEOUT_S = 120.0
#: Seconds between SIGTERM and SIGKILL when a server is stopped.
DEFAULT_STOP_GRACE_S = 10.0
#: Servers the harness starts listen on loopback only (containers share the host network).
LOOPBACK = "127.0.0.1"
#: server.cpp logs each bound address once the model is loaded (SRV_INF "listening on");
#: with ``--port 0`` this line is the only place the port is told.
LISTENING = re.compile(rb"listening on https?://[^\s:]+:(\d+)")

# One counter for every runner: two servers of one process never share a log file.
_log_numbers = itertools.count(1)

ServerT = TypeVar("ServerT", bound=RunningServer)


@dataclass(frozen=True)
class PreparedLaunch:
    """What a runner's ``spawn`` starts: the spec as launched, its argv, its log file."""

    spec: LaunchSpec
    argv: list[str]
    #: Not created yet: ``spawn`` creates it (or hands it to what writes the log).
    log_path: Path


def announced_port(log: bytes) -> int | None:
    """The port in the first ``listening on`` line of ``log``, or None if there is none."""
    match = LISTENING.search(log)
    return int(match.group(1)) if match else None


def next_log_path(log_dir: Path, stem: str = "llama-server") -> Path:
    """A fresh log file name in ``log_dir`` (created if missing), unique in this process."""
    log_dir.mkdir(parents=True, exist_ok=True)
    return log_dir / f"{stem}-{os.getpid()}-{next(_log_numbers)}.log"


def read_log_tail(path: Path, lines: int) -> list[str]:
    """The last ``lines`` lines of a log file; empty if it does not exist yet."""
    try:
        with path.open("rb") as handle:
            handle.seek(0, 2)
            size = handle.tell()
            # Tiny-model startup logs are a few hundred KiB at most; read a bounded window.
            handle.seek(max(0, size - 256 * 1024))
            data = handle.read()
    except FileNotFoundError:
        return []
    return data.decode("utf-8", errors="replace").splitlines()[-lines:]


def read_log_text(path: Path) -> str:
    """A whole log file; a server's output is not always valid UTF-8."""
    return path.read_text(encoding="utf-8", errors="replace")


def launch_server(spec: LaunchSpec, spawn: Callable[[PreparedLaunch], ServerT], *,
                  binary: str, log_dir: Path, default_threads: int | None = None,
                  host: str = LOOPBACK, port: int = 0,
                  log_stem: str = "llama-server") -> ServerT:
    """Prepare ``spec``, ``spawn`` the server, track it and tell the observers.

    ``binary`` heads the argv; ``host``/``port`` are its address (port 0: the kernel
    picks a free one, read back from the log). Returns without waiting for readiness.
    """
    if spec.threads is None and default_threads is not None:
        spec = dataclasses.replace(spec, threads=default_threads)
    prepared = PreparedLaunch(spec, spec.to_argv(binary, host, port),
                              next_log_path(log_dir, log_stem))
    server = spawn(prepared)
    track(server)
    notify_launched(server, prepared.spec)
    return server


def until_ready(runner: ServerRunner[RunningServer], server: ServerT) -> ServerT:
    """``server`` once ``runner``'s conditions hold within its timeout; a server that is
    not ready is stopped before the error goes on."""
    return ready_or_stopped(server, runner.conditions, runner.ready_timeout_s)
