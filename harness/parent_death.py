"""A child process that dies with the harness: Linux's parent-death signal.

Every long-lived child the harness starts (llama-server, a build step, Allure's node)
must not outlive a harness that is killed outright (``kill -9``, an OOM kill), where no
``finally`` runs. ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` in the child asks the kernel to
kill it when the thread that forked it exits. Its one caveat: the *thread*, not the
process — right for the CLI's main thread and the service's long-lived workers, wrong
for a short-lived thread (its child would die with it).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Callable

#: prctl(2) option (linux/prctl.h).
_PR_SET_PDEATHSIG = 1


def die_with_parent_hook() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGKILL the child when its parent thread dies.

    Everything is looked up before the fork, so the child makes two or three system
    calls and takes no lock (``preexec_fn`` is unsafe with threads only when it takes a
    lock another thread held at the fork). The setting survives the exec. None off Linux
    (no prctl): there a timeout's process-group kill is all there is.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        # The parent may have died between fork and prctl; then no signal would come.
        if os.getppid() != parent:
            os.kill(os.getpid(), kill)

    return preexec
