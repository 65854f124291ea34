"""How fast the measured server's cores run right now: a covariate known before the pair.

A 2-core VM's speed moves by several per cent within seconds (other tenants, the host's
frequency): a server started one second later decodes at another speed, and a
sequential pair's two starts are a second or two apart. A fixed loop this process runs on
the server's own cores just before and just after its timed completions reads that
speed; the pair's ratio of the two readings is a covariate (harness/ab/covariate.py) the
build under test cannot move — the loop is this process's, not the server's.
"""

from __future__ import annotations

import time

from harness.ab.pinning import client_pinned

#: Iterations of the loop: about 20 ms on one core here, small beside a 1 s start.
LOOP_ITERATIONS = 200_000


def machine_speed(cpus: set[int] | None) -> float:
    """Iterations per second of a fixed integer loop on ``cpus`` (None: where this thread
    runs), run by the calling thread."""
    with client_pinned(cpus):
        started = time.perf_counter()
        state = 1
        for _ in range(LOOP_ITERATIONS):
            state = (state * 1103515245 + 12345) & 0xFFFFFFFF
        elapsed = time.perf_counter() - started
    # ``state`` is used so no interpreter can drop the loop as dead code.
    return (LOOP_ITERATIONS + (state & 0)) / max(elapsed, 1e-9)
