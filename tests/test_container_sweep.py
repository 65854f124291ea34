"""An interrupted container run leaves nothing behind: the next session sweeps it.

A pytest session running the container runner is killed outright (SIGKILL: no
teardown, no atexit) while its server container runs; the container outlives it, as a
container does. The next ``--harness-runner container`` session removes it at start.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.probes.docker_engine import docker_engine
from harness.runners.container_labels import MANAGED_LABEL, owner_of

pytestmark = [pytest.mark.docker, pytest.mark.server]

HOLDING_TEST = """
import time
from harness.planning.launch import LaunchSpec

def test_hold(start_server, fixture_set):
    start_server(LaunchSpec(model=fixture_set.model("dense"), ctx_size=256))
    print("SERVER-UP", flush=True)
    time.sleep(300)
"""


def _managed(owner_pid: int | None = None) -> list[str]:
    """The harness's containers; with ``owner_pid``, only those that process started (a
    parallel worker's own containers come and go beside this test)."""
    client = docker_engine()
    try:
        return [c.id for c in client.containers.list(all=True,
                                                     filters={"label": f"{MANAGED_LABEL}=1"})
                if owner_pid is None or owner_of(c.labels)[1] == owner_pid]
    finally:
        client.close()


def _pytest(directory: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-s",
         "--harness-runner", "container", *args],
        cwd=directory, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)


def test_a_killed_session_is_swept_by_the_next(tmp_path: Path, container_image: str) -> None:
    (tmp_path / "test_hold.py").write_text(HOLDING_TEST)
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    before = set(_managed())
    holder = _pytest(tmp_path, f"--harness-image={container_image}", "test_hold.py")
    assert holder.stdout is not None
    try:
        deadline = time.monotonic() + 120
        for line in holder.stdout:
            if "SERVER-UP" in line or time.monotonic() > deadline:
                break
        left = set(_managed(owner_pid=holder.pid)) - before
        assert left, "the holding session should have a server container running"
    finally:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait()
    assert left <= set(_managed()), "a SIGKILLed session cannot clean up: the container stays"
    sweeper = _pytest(tmp_path, f"--harness-image={container_image}", "test_nothing.py")
    output, _ = sweeper.communicate(timeout=120)
    assert sweeper.returncode == 0, output
    assert not left & set(_managed()), "the next session's start must sweep the leftover"
