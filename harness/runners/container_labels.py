"""The labels every harness container carries, so that leftovers can be found and removed.

A container outlives a harness that was killed outright (nothing like
``PR_SET_PDEATHSIG`` ties it to its parent), so each one says who started it: the
managed label marks it as the harness's, the session label names the process's session,
and the owner label names the host and pid, so a sweep can tell a dead session's
containers from a live one's (:mod:`harness.runners.container_sweep`).
"""

from __future__ import annotations

import os
import socket
import uuid

#: Every container the harness starts carries this label (value "1"); sweeps go by it.
MANAGED_LABEL = "org.llama-harness.managed"
#: The harness process (session) that started the container.
SESSION_LABEL = "org.llama-harness.plugin.session"
#: This process's session id, the value of SESSION_LABEL on its containers.
SESSION_ID = uuid.uuid4().hex
#: The host and pid of the process that started the container: a sweep removes the
#: containers whose owner is gone, and never a live session's.
OWNER_LABEL = "org.llama-harness.owner"
OWNER = f"{socket.gethostname()}:{os.getpid()}"


def harness_labels() -> dict[str, str]:
    """The labels of a container this process starts."""
    return {MANAGED_LABEL: "1", SESSION_LABEL: SESSION_ID, OWNER_LABEL: OWNER}


def owner_of(labels: dict[str, str] | None) -> tuple[str, int | None]:
    """The host and pid a container's labels name as its owner (pid None if unreadable)."""
    host, _, pid = (labels or {}).get(OWNER_LABEL, "").rpartition(":")
    return host, int(pid) if pid.isdigit() else None
