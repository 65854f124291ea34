"""The ``ServerRunner`` protocol: how the harness starts and stops a llama-server.

A runner turns a :class:`LaunchSpec` into a running server and guarantees it can be
stopped. The subprocess runner is the first implementation; a container runner follows
the same shape.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from harness.planning.launch import LaunchSpec


class RunningServer(Protocol):
    """A started server: its address, command line and log, and how to stop it."""

    @property
    def argv(self) -> list[str]: ...

    @property
    def log_path(self) -> Path: ...

    @property
    def base_url(self) -> str:
        """``http://host:port``; raises ServerError until the server has bound its port."""
        ...

    def exit_code(self) -> int | None:
        """None while the server runs; its exit status (negative: the signal) once it ended."""
        ...

    def log_tail(self, lines: int = 40) -> list[str]: ...

    def stop(self) -> int | None:
        """Stop the server (terminate, wait, kill); idempotent. Returns the exit status."""
        ...


class ServerRunner(Protocol):
    def start(self, spec: LaunchSpec) -> RunningServer:
        """Start a server for ``spec`` and return once it is ready to serve."""
        ...


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
