"""Which cores a compared server runs on: halves of this process's cores, and pinning
(of a server, and of the client that times it).

The duet design gives each arm its own half; the sequential design gives both arms of a
pair the same half. A server is pinned thread by thread (``sched_setaffinity`` acts on
one thread), and the threads it makes later inherit the mask.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


def usable_cores() -> list[int]:
    """The cores this process may run on, in order."""
    return sorted(os.sched_getaffinity(0))


def core_halves() -> tuple[set[int], set[int]]:
    """The usable cores split in two: one half per arm (duet), or per pair (sequential)."""
    cores = usable_cores()
    middle = len(cores) // 2
    return set(cores[:middle]), set(cores[middle:])


def pin_process(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` onto ``cpus``; threads made later inherit the mask."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, PermissionError):
            continue  # a thread that ended between listing and pinning


@contextlib.contextmanager
def client_pinned(cpus: set[int] | None) -> Iterator[None]:
    """The calling thread on ``cpus`` for the block (None: left where it is), then back.
    Only the calling thread moves (``sched_setaffinity(0)`` acts on it alone): it is the
    one that sends the timed requests, and threads it starts inside inherit the mask."""
    if cpus is None:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
