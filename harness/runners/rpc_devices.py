"""llama.cpp's RPC servers (``ggml-rpc-server``) as child processes: the remote devices a
llama-server is pointed at with ``--rpc HOST:PORT,...``, each one more device to it.

Each server gets a free loopback port (bound, read and released here: it has no
``-p 0``), logs stdout and stderr to one file, dies with the harness
(``PR_SET_PDEATHSIG``) and is ready once it listens on its port and a TCP connect
succeeds. The probe is closed at once (the server serves one client at a time; it logs
``Accepted client connection`` / ``Client connection closed`` and serves the next). The
probe also flushes the start banner into the log, which the server ``printf``s unflushed.
A port it cannot bind ends it with *exit code 0* and ``Failed to create server socket``:
another process took the port after its release here, so another is tried.

The memory cap: the server has no flag for one and reports the host's memory as its
device's, so the cap is ``RLIMIT_AS``, set between fork and exec: the idle server's
VmSize (measured once per binary) + the cap + ``CAP_MARGIN_BYTES`` + a stack per compute
thread past the first. A llama-server putting more than the cap on the device fails::

    llama-server:    E ggml_backend_buft_alloc_buffer_n_default: failed to allocate
                       RPC0[127.0.0.1:PORT] buffer of size 38181888
                     E llama_model_load: error loading model: unable to allocate
                       RPC0[127.0.0.1:PORT] buffer
                     E srv  llama_server: exiting due to model loading error
    ggml-rpc-server: ggml_aligned_malloc: insufficient memory (attempted to allocate  36.41 MB)
                     ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer
                       of size 38181888

and the RPC server lives on. A llama-server whose RPC endpoint does not answer aborts
with ``ggml-rpc.cpp:547: Failed to connect to 127.0.0.1:PORT``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import psutil

from harness.errors import ServerError, ServerStuckError
from harness.parent_death import die_with_parent_hook
from harness.runners.launching import LOOPBACK, next_log_path, read_log_tail, read_log_text

#: Seconds from the start of an RPC server to its accepting a connection, bind retries
#: included. It serves within milliseconds; the bound is for a machine under load.
READY_TIMEOUT_S = 30.0
#: Seconds between SIGTERM and SIGKILL when a server is stopped.
STOP_GRACE_S = 10.0
#: Seconds to wait for a server to be reaped after SIGKILL; longer means the kernel holds it.
KILL_WAIT_S = 10.0
#: Ports tried when the server cannot bind the one picked (taken since it was released).
BIND_ATTEMPTS = 3
#: Address space a capped server may use beyond the idle server's and the cap: the
#: server's own allocations while it serves, which a real device's memory would not
#: hold: the receive buffer of the tensor being set (a whole tensor), the graph a
#: compute call deserializes, malloc's bookkeeping. Measured with the bench fixture
#: (largest tensor 1.5 MiB): 0.7 MiB.
CAP_MARGIN_BYTES = 16 * 1024 * 1024
#: A thread's stack when RLIMIT_STACK is unlimited: glibc's default then, measured 2 MiB on
#: x86-64; 8 MiB bounds it on the other architectures.
_UNLIMITED_STACK_BYTES = 8 * 1024 * 1024
#: The server's line when it cannot bind its port (it then exits with code 0).
BIND_FAILED = "Failed to create server socket"
_POLL_S = 0.02
#: Each binary's idle VmSize in bytes (:func:`idle_vm_bytes`).
_idle_vm: dict[Path, int] = {}


class RpcServerError(ServerError):
    """An RPC server could not be started, or did not become reachable."""


@dataclass(kw_only=True, eq=False)
class RpcServer:
    """One running ``ggml-rpc-server``; a context manager that stops it on exit.

    ``memory_cap_bytes`` is the device memory asked for, ``address_space_bytes`` the
    RLIMIT_AS the process runs under; None for both when uncapped.
    """

    process: subprocess.Popen[bytes]
    binary: Path
    host: str
    port: int
    log_path: Path
    memory_cap_bytes: int | None
    address_space_bytes: int | None
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def exit_code(self) -> int | None:
        """None while it runs; its exit status (negative: the signal) once it ended."""
        return self.process.poll()

    def log_text(self) -> str:
        return read_log_text(self.log_path)

    def log_tail(self, lines: int = 40) -> list[str]:
        return read_log_tail(self.log_path, lines)

    def kill(self) -> None:
        """SIGKILL, and reap: an RPC server lost mid-run, for fault injection."""
        with self._lock:
            if self.process.poll() is None:
                self.process.kill()
                self._reap_killed()

    def stop(self) -> int | None:
        """SIGTERM, ``STOP_GRACE_S``, then SIGKILL; reaped. Safe to call twice."""
        with self._lock:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(STOP_GRACE_S)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self._reap_killed()
            return self.process.returncode

    def _reap_killed(self) -> None:
        try:
            self.process.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            raise ServerStuckError(
                f"{self.binary} (pid {self.pid}) outlived SIGKILL by {KILL_WAIT_S:g} s "
                f"(KILL_WAIT_S): the kernel holds it (state D); log: {self.log_path}") from None

    def __enter__(self) -> RpcServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


def start_rpc_server(binary: Path, log_dir: Path, *, memory_cap_bytes: int | None = None,
                     threads: int = 1, host: str = LOOPBACK,
                     _port: int | None = None) -> RpcServer:
    """Start an RPC server and wait until it accepts connections (``READY_TIMEOUT_S``).

    ``memory_cap_bytes`` caps what its device can allocate (module docstring). ``_port``
    forces the port, for tests: no other is tried when it cannot be bound.
    """
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise RpcServerError(f"RPC server binary {binary} does not exist or is not "
                             "executable; build one with `harness build --rpc`")
    address_space = None
    if memory_cap_bytes is not None:
        address_space = (idle_vm_bytes(binary, log_dir) + memory_cap_bytes
                         + CAP_MARGIN_BYTES + (threads - 1) * _thread_stack_bytes())
    deadline = time.monotonic() + READY_TIMEOUT_S
    tried: list[str] = []
    for _ in range(1 if _port is not None else BIND_ATTEMPTS):
        port = _port if _port is not None else _free_port(host)
        server = _spawn(binary, log_dir, host=host, port=port, threads=threads,
                        cap=(memory_cap_bytes, address_space))
        try:
            if _wait_ready(server, deadline):
                return server
        except BaseException:
            server.stop()
            raise
        tried.append(f"{server.endpoint} (log {server.log_path})")
    raise RpcServerError(f"{binary} could not bind a port: {BIND_FAILED!r} at "
                         f"{', '.join(tried)}; another process held each (BIND_ATTEMPTS)")


def idle_vm_bytes(binary: Path, log_dir: Path) -> int:
    """An idle, uncapped server's address space (VmSize), measured once per binary."""
    key = binary.resolve()
    if key not in _idle_vm:
        with start_rpc_server(binary, log_dir) as server:
            # psutil's vms is /proc/PID/status's VmSize.
            _idle_vm[key] = int(psutil.Process(server.pid).memory_info().vms)
    return _idle_vm[key]


@contextlib.contextmanager
def rpc_servers(binary: Path, caps: Sequence[int | None], log_dir: Path, *,
                threads: int = 1) -> Iterator[tuple[RpcServer, ...]]:
    """One ready server per cap, in order; all are stopped on exit, and those started
    are stopped when a later one fails to start, before its error goes on."""
    with contextlib.ExitStack() as stack:
        yield tuple(stack.enter_context(start_rpc_server(
            binary, log_dir, memory_cap_bytes=cap, threads=threads)) for cap in caps)


def rpc_argument(servers: Sequence[RpcServer]) -> str:
    """llama-server's ``--rpc`` value: the endpoints, in order (RPC0, RPC1, ...)."""
    return ",".join(server.endpoint for server in servers)


def _free_port(host: str) -> int:
    # Released before the server binds it; a port taken meanwhile is retried.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def _thread_stack_bytes() -> int:
    # Each compute thread past the first (OpenMP's or ggml's) maps a stack of glibc's
    # default size, RLIMIT_STACK's soft limit: measured, one per thread in VmSize.
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return _UNLIMITED_STACK_BYTES if soft == resource.RLIM_INFINITY else soft


def _spawn(binary: Path, log_dir: Path, *, host: str, port: int, threads: int,
           cap: tuple[int | None, int | None]) -> RpcServer:
    memory_cap, address_space = cap
    log_path = next_log_path(log_dir, "ggml-rpc-server")
    argv = [str(binary), "-H", host, "-p", str(port), "-t", str(threads)]
    try:
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                # Only prctl and setrlimit run between fork and exec; no locks are taken.
                preexec_fn=_child_setup(address_space))  # noqa: PLW1509
    except (OSError, subprocess.SubprocessError) as exc:
        raise RpcServerError(f"could not start {' '.join(argv)}: {exc}") from exc
    return RpcServer(process=process, binary=binary, host=host, port=port, log_path=log_path,
                     memory_cap_bytes=memory_cap, address_space_bytes=address_space)


def _child_setup(address_space: int | None) -> Callable[[], None] | None:
    """The ``preexec_fn``: the parent-death signal, and RLIMIT_AS when capped."""
    die = die_with_parent_hook()
    if address_space is None:
        return die
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY and hard < address_space:
        raise RpcServerError(f"the memory cap needs RLIMIT_AS {address_space} bytes, above "
                             f"this process's hard limit {hard} (ulimit -v)")
    limits = (address_space, address_space)

    def setup() -> None:
        resource.setrlimit(resource.RLIMIT_AS, limits)
        if die is not None:
            die()

    return setup


def _wait_ready(server: RpcServer, deadline: float) -> bool:
    """True once ``server`` listens and accepts; False when its port was taken."""
    while True:
        code = server.exit_code()
        if code is not None:
            if BIND_FAILED in server.log_text():
                return False
            raise RpcServerError("\n".join([
                f"{server.binary} exited (code {code}) before it served at {server.endpoint}",
                f"--- last lines of {server.log_path} ---", *server.log_tail(), "---"]))
        # Its own listener first: a connect alone could reach whoever took the port.
        if _listens(server) and _accepts(server, deadline):
            return True
        if time.monotonic() >= deadline:
            server.stop()
            raise RpcServerError(
                f"{server.binary} did not accept a connection at {server.endpoint} within "
                f"{READY_TIMEOUT_S:g} s (READY_TIMEOUT_S); stopped. Log: {server.log_path}")
        time.sleep(_POLL_S)


def _listens(server: RpcServer) -> bool:
    try:
        connections = psutil.Process(server.pid).net_connections(kind="tcp")
    except psutil.AccessDenied:
        return True  # not ours to read: the connect alone decides
    except psutil.Error:
        return False  # gone: the next look at its exit code says why
    return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == server.port
               for c in connections)


def _accepts(server: RpcServer, deadline: float) -> bool:
    timeout = max(0.1, min(1.0, deadline - time.monotonic()))
    try:
        # Closed at once: the server serves one client at a time.
        socket.create_connection((server.host, server.port), timeout=timeout).close()
    except OSError:
        return False
    return True

