"""Helpers the service, upload, compare, repro and gate-job tests share.

Imported as ``import service_helpers`` (pytest puts tests/ on the path, as for
results_fixtures).
"""

from __future__ import annotations

import socket
import subprocess
import time
from pathlib import Path

import httpx

#: How long a ``harness serve`` child may take to answer /healthz.
START_DEADLINE_S = 60.0


def no_report(results_dir: Path, output_dir: Path, *, history_path: Path,
              report_name: str) -> list[str]:
    """A report generator that writes a placeholder page instead of running Allure."""
    output_dir.mkdir(parents=True)
    (output_dir / "index.html").write_text("<html></html>")
    return []


def free_port() -> int:
    """A loopback port nobody listens on (yet)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_healthy(url: str, server: subprocess.Popen[bytes], log: Path | None = None) -> None:
    """Until ``url``/healthz answers 200; fails with the service's output if it exits."""
    deadline = time.monotonic() + START_DEADLINE_S
    while True:
        if server.poll() is not None:
            output = (log.read_text() if log is not None
                      else (server.stdout.read().decode() if server.stdout else ""))
            raise AssertionError(f"harness serve exited {server.returncode}:\n{output}")
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "harness serve did not become healthy"
        time.sleep(0.2)


def tmp_leftovers(data_dir: Path) -> list[Path]:
    """What the service's tmp/ holds besides the replicas' own folders: uploads,
    extractions or reports in progress, or left behind."""
    root = data_dir / "tmp"
    replicas = root / "replicas"
    return sorted(path for path in root.rglob("*")
                  if replicas not in {path, path.parent})
