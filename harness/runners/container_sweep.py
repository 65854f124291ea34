"""Removing harness containers that nobody will stop: a killed session's leftovers.

A harness killed outright leaves its containers running. The plugin sweeps at session
start (:func:`sweep_orphans`: containers whose owning process on this host is gone) and
at session end (:func:`sweep_containers` with this session's id), going by the labels of
:mod:`harness.runners.container_labels`. Parallel sessions and xdist workers share one
engine, so neither sweep touches a live session's containers.
"""

from __future__ import annotations

import socket
import time
from typing import Any

import psutil
from docker.errors import APIError

from harness.runners.container_labels import MANAGED_LABEL, SESSION_LABEL, owner_of


def sweep_containers(client: Any, older_than_s: float | None = None, *,
                     session: str | None = None) -> int:
    """Remove (by force) every container with the managed label; return how many.

    For session start and end: a harness killed outright leaves its containers running.
    ``older_than_s`` spares containers created more recently than that; ``session``
    limits the sweep to one session's containers (this process's:
    :data:`~harness.runners.container_labels.SESSION_ID`), which parallel workers sharing
    one engine need so as not to remove each other's.
    """
    labels = [f"{MANAGED_LABEL}=1"]
    if session is not None:
        labels.append(f"{SESSION_LABEL}={session}")
    now = time.time()
    removed = 0
    for summary in client.api.containers(all=True, filters={"label": labels}):
        # The list API gives "Created" as Unix seconds.
        if older_than_s is not None and now - float(summary["Created"]) < older_than_s:
            continue
        removed += _remove(client, summary["Id"])
    return removed


def sweep_orphans(client: Any) -> int:
    """Remove the managed containers whose owning process on this host has ended.

    For session start: a harness killed outright leaves its containers running, while a
    live session (another xdist worker, a parallel run) keeps its own.
    """
    host = socket.gethostname()
    removed = 0
    for summary in client.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"}):
        owner_host, pid = owner_of(summary.get("Labels"))
        if owner_host != host or (pid is not None and psutil.pid_exists(pid)):
            continue
        removed += _remove(client, summary["Id"])
    return removed


def _remove(client: Any, container_id: str) -> int:
    """Force-remove one container; 1 if this call removed it, 0 if it was already going."""
    try:
        client.api.remove_container(container_id, force=True, v=True)
    except APIError as exc:
        # Another sweep (or the owner's stop) got there first.
        if exc.status_code in (404, 409):
            return 0
        raise
    return 1
