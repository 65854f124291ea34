"""Runs llama-server as a child process of the harness.

The server is started with ``--port 0`` so the kernel hands it a free port with no
race between workers; the port is read back from its ``listening on`` log line. Its
stdout and stderr go to one log file per server. Every process started here is tracked
(:mod:`harness.runners.live`) so that an exception, a failed test, Ctrl-C or interpreter
exit stops it; on Linux the child also gets ``PR_SET_PDEATHSIG`` so it dies even if the
harness is killed outright.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from harness.errors import ServerError, ServerStuckError
from harness.parent_death import die_with_parent_hook
from harness.planning.launch import LaunchSpec
from harness.runners.base import WaitCondition
from harness.runners.launching import (
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_GRACE_S,
    LOOPBACK,
    PreparedLaunch,
    announced_port,
    launch_server,
    read_log_tail,
    read_log_text,
    until_ready,
)
from harness.runners.live import forget
from harness.runners.observe import notify_stopping
from harness.runners.readiness import default_conditions, describe_failure

#: Seconds to wait for a server to be reaped after SIGKILL. SIGKILL cannot be caught or
#: ignored; a process still there after this is held by the kernel.
KILL_WAIT_S = 10.0


class SubprocessServer:
    """One llama-server child process; a context manager that stops it on exit."""

    def __init__(self, argv: list[str], log_path: Path, process: subprocess.Popen[bytes],
                 stop_grace_s: float) -> None:
        self._argv = argv
        self._log_path = log_path
        self._process = process
        self._stop_grace_s = stop_grace_s
        self._port: int | None = None
        self._scanned = 0
        self._lock = threading.Lock()

    @property
    def argv(self) -> list[str]:
        return list(self._argv)

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def pid(self) -> int:
        return self._process.pid

    @property
    def port(self) -> int | None:
        """The bound port, once the server has announced it in its log."""
        if self._port is None:
            self._port = self._scan_log_for_port()
        return self._port

    def _scan_log_for_port(self) -> int | None:
        # Read only what was appended since the last look (with a small overlap for a
        # line split across reads): readiness polls this every few milliseconds.
        start = max(0, self._scanned - 256)
        try:
            with self._log_path.open("rb") as handle:
                handle.seek(start)
                chunk = handle.read()
        except FileNotFoundError:
            return None
        self._scanned = start + len(chunk)
        return announced_port(chunk)

    @property
    def base_url(self) -> str:
        port = self.port
        if port is None:
            raise ServerError(f"the server (pid {self.pid}) has not announced its port yet")
        return f"http://{LOOPBACK}:{port}"

    def host_pid(self) -> int | None:
        return self.pid

    def exit_code(self) -> int | None:
        return self._process.poll()

    def log_tail(self, lines: int = 40) -> list[str]:
        return read_log_tail(self._log_path, lines)

    def log_text(self) -> str:
        return read_log_text(self._log_path)

    def stop(self) -> int | None:
        """SIGTERM, wait up to the grace period, then SIGKILL. Safe to call twice.

        ServerStuckError when the process outlives SIGKILL by ``KILL_WAIT_S``: the kernel
        holds it (a driver or I/O wait), and waiting longer would hang the caller."""
        with self._lock:
            try:
                if self._process.poll() is None:
                    notify_stopping(self)
                    self._process.send_signal(signal.SIGTERM)
                    try:
                        self._process.wait(self._stop_grace_s)
                    except subprocess.TimeoutExpired:
                        self._process.kill()
                        self._reap_killed()
            finally:
                forget(self)
            return self._process.returncode

    def _reap_killed(self) -> None:
        try:
            self._process.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            raise ServerStuckError(describe_failure(
                self, f"llama-server (pid {self.pid}) did not exit within {KILL_WAIT_S:g} s "
                "of SIGKILL: the kernel holds it (uninterruptible sleep, state D in "
                f"/proc/{self.pid}/status)",
                hint="a GPU driver or a storage device is stuck; the process cannot be "
                "ended from here, check the driver's kernel log (dmesg)",
            )) from None

    def __enter__(self) -> SubprocessServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class SubprocessRunner:
    """Starts servers from one binary, logging into ``log_dir``."""

    def __init__(
        self,
        binary: Path,
        log_dir: Path,
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        conditions: Sequence[WaitCondition] | None = None,
        env: Mapping[str, str] | None = None,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        default_threads: int | None = None,
    ) -> None:
        if not binary.is_file() or not os.access(binary, os.X_OK):
            raise ServerError(
                f"llama-server binary {binary} does not exist or is not executable; build it "
                "with `harness build --backend cpu` or point HARNESS_SERVER_BIN at one"
            )
        self.binary = binary
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.conditions = tuple(conditions) if conditions is not None else default_conditions()
        self.env = dict(env) if env is not None else None
        self.stop_grace_s = stop_grace_s
        #: ``--threads`` for specs that leave it unset (servers sharing the machine).
        self.default_threads = default_threads

    def launch(self, spec: LaunchSpec) -> SubprocessServer:
        """Start the process and return at once, without waiting for readiness."""
        return launch_server(spec, self._spawn, binary=str(self.binary), log_dir=self.log_dir,
                             default_threads=self.default_threads)

    def start(self, spec: LaunchSpec) -> SubprocessServer:
        """Start a server and wait until it serves; on any failure it is stopped first."""
        return until_ready(self, self.launch(spec))

    def _spawn(self, launch: PreparedLaunch) -> SubprocessServer:
        with launch.log_path.open("wb") as log:
            process = subprocess.Popen(
                launch.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                env=self.env,
                # Only prctl runs between fork and exec; no locks are taken there.
                preexec_fn=die_with_parent_hook(),  # noqa: PLW1509
            )
        return SubprocessServer(launch.argv, launch.log_path, process, self.stop_grace_s)
