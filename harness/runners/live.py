"""Every server this process launched and has not stopped, so that none outlives it.

Runners track each server as it is launched and each server forgets itself when it is
stopped; :func:`stop_all` stops what is left, on Ctrl-C (the plugin calls it) and at
interpreter exit (registered here). One registry for every runner, so one call cleans
up child processes and containers alike. References are strong on purpose: a container
a test forgot to stop would otherwise keep running after the harness is gone (a child
process would at least get ``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import atexit
import threading
from collections.abc import Iterable

from harness.runners.base import RunningServer

_live: dict[int, RunningServer] = {}
_lock = threading.Lock()


def track(server: RunningServer) -> None:
    with _lock:
        _live[id(server)] = server


def forget(server: RunningServer) -> None:
    with _lock:
        if _live.get(id(server)) is server:
            del _live[id(server)]


def stop_all() -> None:
    """Stop every server this process launched and has not stopped yet."""
    with _lock:
        servers = list(_live.values())
    stop_each(servers)


def stop_each(servers: Iterable[RunningServer]) -> None:
    """Stop each of ``servers``. One that cannot be stopped (one the kernel holds past
    SIGKILL raises) does not keep the rest running: the first error is raised last."""
    errors: list[Exception] = []
    for server in servers:
        try:
            server.stop()
        except Exception as exc:  # every server gets its stop before any error goes on
            errors.append(exc)
    if errors:
        raise errors[0]


atexit.register(stop_all)
