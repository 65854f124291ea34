"""A child started with ``die_with_parent_hook`` dies when the harness is killed outright.

A real ``kill -9`` of a real parent process: no ``finally`` runs in it, so only the
kernel's parent-death signal can stop the child it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

PARENT = textwrap.dedent("""
    import subprocess, sys, time
    from harness.parent_death import die_with_parent_hook
    child = subprocess.Popen(["sleep", "600"], preexec_fn=die_with_parent_hook())
    print(child.pid, flush=True)
    time.sleep(600)
""")


@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="the parent-death signal is Linux's (prctl)")
def test_the_child_is_killed_with_its_parent() -> None:
    with subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE,
                          text=True) as parent:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        child = psutil.Process(child_pid)
        assert child.is_running()
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                if child.status() == psutil.STATUS_ZOMBIE:
                    break
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        else:
            child.kill()
            pytest.fail(f"sleep (pid {child_pid}) outlived its killed parent")
