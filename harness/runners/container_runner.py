"""Runs llama-server in a Docker container, with the subprocess runner's surface.

:class:`LlamaServerContainer` is a testcontainers module in the shape of the library's own
(``OllamaContainer`` and friends): the image's entrypoint is the server and the container
command is its arguments. :class:`ContainerRunner` and :class:`ContainerServer` wrap it in
the harness's ``ServerRunner`` / ``RunningServer`` surface, so a suite runs unchanged on a
server in a container.

- Networking: the host's (``network_mode="host"``, no published ports; the engine runs
  with ``--bridge=none``). The server gets ``--port 0`` exactly as a child process does,
  and its ``listening on http://127.0.0.1:PORT`` line names the port.
- Files: the spec's model, drafter and every other path are bind-mounted read-only at
  their own absolute paths, so the argv is the subprocess runner's, byte for byte, bar
  the binary (the image's ``/app/llama-server``).
- Log: a background thread follows the container's log stream into a per-server file in
  ``log_dir``, flushed chunk by chunk, so the readiness wait, the verdicts and a failure
  message read the same file they read for a child process.
- Exit status: known once the log stream has ended and docker reports the status, so a
  failure message always holds the last lines. Docker reports a process killed by signal
  N as 128+N; it is turned into -N, the subprocess convention.
- Cleanup: containers carry ``org.llama-harness.managed=1`` and this process's session
  label; every server is tracked and stopped at interpreter exit, and
  :func:`sweep_containers` removes leftovers of a harness that was killed outright.
  Stopping is SIGTERM, the grace period, SIGKILL (``docker stop``), then removal.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import psutil
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from harness.errors import ConfigError, ServerError
from harness.planning.container_gpu import ContainerGpuArgs, GpuAccess
from harness.planning.container_plan import SERVER_PATH_IN_IMAGE
from harness.planning.launch import LaunchSpec
from harness.probes.docker_engine import docker_engine
from harness.probes.gpu_access import check_gpu_access
from harness.runners.base import read_log_tail
from harness.runners.observe import notify_launched, notify_stopping

# The log-line pattern and the log-file counter are the subprocess runner's own, so both
# runners read the port the same way and never name two log files alike in one process.
from harness.runners.subprocess_runner import (
    _LISTENING,
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_GRACE_S,
    LOOPBACK,
    _counter,
)
from harness.supervise.readiness import WaitCondition, default_conditions, ready_or_stopped

#: Every container the harness starts carries this label (value "1"); sweeps go by it.
MANAGED_LABEL = "org.llama-harness.managed"
#: The harness process (session) that started the container.
SESSION_LABEL = "org.llama-harness.session"
#: This process's session id, the value of SESSION_LABEL on its containers.
SESSION_ID = uuid.uuid4().hex
#: The host and pid of the process that started the container: a sweep removes the
#: containers whose owner is gone, and never a live session's.
OWNER_LABEL = "org.llama-harness.owner"
OWNER = f"{socket.gethostname()}:{os.getpid()}"
#: Docker reports "killed by signal N" as 128+N (the shell convention); N is at most
#: SIGRTMAX on Linux.
_SIGNAL_BASE = 128
_MAX_SIGNAL = int(signal.SIGRTMAX)
#: How long stop() waits for the log follower to drain after the container ended.
_FOLLOWER_JOIN_S = 30.0
#: A partial log line longer than this is not a ``listening on`` line; keep memory bounded.
_MAX_PARTIAL_LINE = 4096

_live: dict[int, ContainerServer] = {}
_live_lock = threading.Lock()


def image_missing_message(image: str) -> str:
    """What to do when ``image`` is not in the local engine (nothing is ever pulled)."""
    return (
        f"image {image} is not in the local Docker engine, and the harness pulls nothing "
        "from a registry; build it from ci/docker/<backend>.Dockerfile as ci/README.md "
        "('Building by hand') shows. For the CPU image: `harness base-image --distro "
        "debian:13`, then `docker build --network host -f ci/docker/cpu.Dockerfile "
        "--build-arg BUILD_BASE=harness-base/debian:13 --build-arg "
        "RUNTIME_BASE=harness-base/debian:13 --build-arg CMAKE_FLAGS=\"$FLAGS\" "
        f"-t {image} \"$HARNESS_CACHE/source/<digest>\"` with FLAGS from "
        "harness.planning.container_plan.container_build_args")


def status_from_docker(status: int) -> int:
    """Docker's exit status in the subprocess convention: killed by signal N → -N."""
    if _SIGNAL_BASE < status <= _SIGNAL_BASE + _MAX_SIGNAL:
        return -(status - _SIGNAL_BASE)
    return status


def spec_mounts(spec: LaunchSpec) -> list[Path]:
    """The host files a spec names, to mount read-only at the same paths.

    Every ``Path``-valued field (model, drafter, any added later) and every absolute
    path in ``extra_args`` that names an existing non-folder. A path that does not exist
    is not mounted (docker would refuse the container): the server then reports the
    missing file in its own words, as it does outside a container.
    """
    candidates = [value for field in dataclasses.fields(spec)
                  if isinstance(value := getattr(spec, field.name), Path)]
    candidates += [Path(arg) for arg in spec.extra_args if os.path.isabs(arg)]
    mounts: dict[Path, None] = {}
    for path in candidates:
        absolute = path.absolute()
        if absolute.exists() and not absolute.is_dir():
            mounts[absolute] = None
    return list(mounts)


def absolute_paths(spec: LaunchSpec) -> LaunchSpec:
    """``spec`` with relative ``Path`` fields made absolute (the container's cwd differs)."""
    changes: dict[str, Any] = {
        field.name: value.absolute() for field in dataclasses.fields(spec)
        if isinstance(value := getattr(spec, field.name), Path) and not value.is_absolute()}
    return dataclasses.replace(spec, **changes) if changes else spec


def _disable_ryuk() -> None:
    # testcontainers' reaper (Ryuk) is an image pulled from Docker Hub, which these
    # engines cannot reach; the harness reaps its own containers by label instead. Set
    # before the first container starts: the config reads the variable lazily, and the
    # attribute wins even where the variable was read already.
    os.environ["TESTCONTAINERS_RYUK_DISABLED"] = "true"
    testcontainers_config.ryuk_disabled = True


class LlamaServerContainer(DockerContainer):
    """llama-server in a container on host networking, its log followed into a file.

    ``server_args`` is the server's argv without the binary (the image's entrypoint is
    the server). Example::

        with LlamaServerContainer("harness-probe/llama-server:cpu",
                                  ["--port", "0", "--model", "/m.gguf"], Path("s.log"),
                                  mounts=[Path("/m.gguf")]) as server:
            ...  # server.get_base_url() once server.get_port() is known
    """

    def __init__(
        self,
        image: str,
        server_args: Sequence[str],
        log_path: Path,
        *,
        mounts: Iterable[Path] = (),
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        gpu: ContainerGpuArgs | None = None,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
        **kwargs: Any,
    ) -> None:
        _disable_ryuk()
        super().__init__(image, env=dict(env or {}), **kwargs)
        self.with_command(list(server_args))
        for path in mounts:
            self.with_volume_mapping(str(path), str(path), "ro")
        self._kwargs = {
            **self._kwargs,
            "network_mode": "host",
            # An explicit (empty) network keeps testcontainers from looking for a
            # docker-in-docker network, which would override host networking.
            "network": None,
            "labels": {**(labels or {}), MANAGED_LABEL: "1", SESSION_LABEL: SESSION_ID,
                       OWNER_LABEL: OWNER},
            # docker-init (tini) as PID 1 forwards SIGTERM and reports a server killed by
            # a signal as 128+N; the server as PID 1 would not die of signals it does not
            # handle, unlike the same server as a child process.
            "init": True,
            "stop_signal": "SIGTERM",
            **(gpu.to_create_kwargs() if gpu is not None else {}),
        }
        self.log_path = log_path
        self.stop_grace_s = stop_grace_s
        self._port: int | None = None
        self._status: int | None = None
        self._ended = threading.Event()
        self._follower: threading.Thread | None = None
        self._stop_lock = threading.Lock()
        self._removed = False

    def start(self) -> Self:
        """Create and start the container and begin following its log.

        The image must be in the local engine: testcontainers would pull a missing one,
        which these engines cannot. A container that was created but could not start
        (a bad device, a missing init binary) is removed before the error is raised.
        """
        client = self.get_docker_client().client
        try:
            client.images.get(self.image)
        except ImageNotFound as exc:
            raise ConfigError(image_missing_message(self.image)) from exc
        try:
            super().start()
        except BaseException as exc:
            self.stop()
            if isinstance(exc, DockerException):
                raise ServerError(f"docker could not start a llama-server container from "
                                  f"{self.image}: {exc}") from exc
            raise
        self._follower = threading.Thread(
            target=self._follow, name=f"llama-server-log-{self.get_container_id()[:12]}",
            daemon=True)
        self._follower.start()
        return self

    def _follow(self) -> None:
        """Copy the log stream to the file until the container ends, then note its status."""
        container = self.get_wrapped_container()
        partial = b""
        try:
            with self.log_path.open("ab") as log:
                for chunk in container.logs(stream=True, follow=True):
                    log.write(chunk)
                    # Flushed per chunk: readiness and failure messages read the file.
                    log.flush()
                    if self._port is None:
                        # Only complete lines are searched, so a port split across two
                        # chunks is never read as its first digits.
                        complete, _, partial = (partial + chunk).rpartition(b"\n")
                        match = _LISTENING.search(complete)
                        if match:
                            self._port = int(match.group(1))
                        partial = partial[-_MAX_PARTIAL_LINE:]
        except DockerException:
            pass  # the container was removed under the stream (a sweep); status below
        finally:
            self._status = self._wait_status(container)
            self._ended.set()

    @staticmethod
    def _wait_status(container: Any) -> int:
        try:
            return status_from_docker(int(container.wait()["StatusCode"]))
        except DockerException:
            # Gone before its status could be read: removed by force, which kills.
            return -signal.SIGKILL

    def get_port(self) -> int | None:
        """The port the server announced in its log, or None before it did."""
        return self._port

    def get_base_url(self) -> str:
        port = self._port
        if port is None:
            raise ServerError(f"the server in container {self._short_id()} has not announced "
                              "its port yet")
        return f"http://{LOOPBACK}:{port}"

    def exit_status(self) -> int | None:
        """None while running; once it ended and its log is complete, its exit status
        (negative: the signal that killed it)."""
        return self._status if self._ended.is_set() else None

    def stop(self, force: bool = True, delete_volume: bool = True) -> None:
        """SIGTERM, the grace period, SIGKILL; drain the log; remove. Safe to call twice."""
        with self._stop_lock:
            if self._removed:
                return
            container = self._container
            if container is not None:
                with contextlib.suppress(NotFound):
                    container.stop(timeout=math.ceil(self.stop_grace_s))
                if self._follower is not None:
                    self._follower.join(_FOLLOWER_JOIN_S)
                if not self._ended.is_set():
                    self._status = self._wait_status(container)
                    self._ended.set()
                try:
                    container.remove(force=force, v=delete_volume)
                except APIError as exc:
                    # 404: already gone; 409: a sweep is removing it right now.
                    if exc.status_code not in (404, 409):
                        raise
            self._removed = True
            self.get_docker_client().client.close()

    def _short_id(self) -> str:
        container = self._container
        return container.short_id if container is not None else "(not started)"


class ContainerServer:
    """One llama-server container in the ``RunningServer`` surface; a context manager."""

    def __init__(self, container: LlamaServerContainer, argv: list[str]) -> None:
        self._container = container
        self._argv = argv

    @property
    def argv(self) -> list[str]:
        """The server's command line, the image's binary first."""
        return list(self._argv)

    @property
    def log_path(self) -> Path:
        return self._container.log_path

    @property
    def container(self) -> LlamaServerContainer:
        return self._container

    @property
    def container_id(self) -> str:
        return self._container.get_container_id()

    def host_pid(self) -> int | None:
        """The server's process id as this host sees it (containers share the host kernel)."""
        wrapped = self._container.get_wrapped_container()
        if wrapped is None:
            return None
        try:
            wrapped.reload()
        except DockerException:
            return None
        pid = int((wrapped.attrs.get("State") or {}).get("Pid") or 0)
        return pid or None

    @property
    def port(self) -> int | None:
        """The bound port, once the server has announced it in its log."""
        return self._container.get_port()

    @property
    def base_url(self) -> str:
        return self._container.get_base_url()

    def exit_code(self) -> int | None:
        return self._container.exit_status()

    def log_tail(self, lines: int = 40) -> list[str]:
        return read_log_tail(self.log_path, lines)

    def log_text(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self) -> int | None:
        """Stop and remove the container; idempotent. Returns the exit status."""
        try:
            if self._container.exit_status() is None:
                notify_stopping(self)
            self._container.stop()
        finally:
            with _live_lock:
                _live.pop(id(self), None)
        return self._container.exit_status()

    def __enter__(self) -> ContainerServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class ContainerRunner:
    """Starts servers from one image, logging into ``log_dir``.

    ``env`` holds variables added to the image's environment (not the host's whole
    environment, which would override the image's PATH and library paths); the GPU
    visibility variables come first, so ``env`` wins over them. ``gpu`` is checked
    against this machine here, so a runner that cannot reach its GPU fails before any
    server starts.
    """

    def __init__(
        self,
        image: str,
        log_dir: Path,
        *,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        conditions: Sequence[WaitCondition] | None = None,
        env: Mapping[str, str] | None = None,
        default_threads: int | None = None,
        gpu: GpuAccess | None = None,
        stop_grace_s: float = DEFAULT_STOP_GRACE_S,
    ) -> None:
        client = docker_engine()
        try:
            try:
                client.images.get(image)
            except ImageNotFound as exc:
                raise ConfigError(image_missing_message(image)) from exc
            runtimes: Mapping[str, Any] = (client.info().get("Runtimes") or {}
                                           if gpu is not None else {})
        finally:
            client.close()
        self.image = image
        self.log_dir = log_dir
        self.ready_timeout_s = ready_timeout_s
        self.conditions = tuple(conditions) if conditions is not None else default_conditions()
        self.env = dict(env) if env is not None else {}
        self.stop_grace_s = stop_grace_s
        #: ``--threads`` for specs that leave it unset (servers sharing the machine).
        self.default_threads = default_threads
        self.gpu = gpu
        self.gpu_args = check_gpu_access(gpu, runtimes) if gpu is not None else None

    def launch(self, spec: LaunchSpec) -> ContainerServer:
        """Start the container and return at once, without waiting for readiness."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if spec.threads is None and self.default_threads is not None:
            spec = dataclasses.replace(spec, threads=self.default_threads)
        spec = absolute_paths(spec)
        argv = spec.to_argv(SERVER_PATH_IN_IMAGE, LOOPBACK, 0)
        log_path = self.log_dir / f"llama-server-{os.getpid()}-{next(_counter)}.log"
        log_path.write_bytes(b"")
        environment = {**(self.gpu_args.environment if self.gpu_args else {}), **self.env}
        container = LlamaServerContainer(
            self.image, argv[1:], log_path, mounts=spec_mounts(spec), env=environment,
            gpu=self.gpu_args, stop_grace_s=self.stop_grace_s)
        container.start()
        server = ContainerServer(container, argv)
        with _live_lock:
            _live[id(server)] = server
        notify_launched(server, spec)
        return server

    def start(self, spec: LaunchSpec) -> ContainerServer:
        """Start a server and wait until it serves; on any failure it is stopped first."""
        return ready_or_stopped(self.launch(spec), self.conditions, self.ready_timeout_s)


def sweep_containers(client: Any, older_than_s: float | None = None, *,
                     session: str | None = None) -> int:
    """Remove (by force) every container with the managed label; return how many.

    For session start and end: a harness killed outright leaves its containers running.
    ``older_than_s`` spares containers created more recently than that; ``session``
    limits the sweep to one session's containers (this process's: :data:`SESSION_ID`),
    which parallel workers sharing one engine need so as not to remove each other's.
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


def sweep_orphans(client: Any) -> int:
    """Remove the managed containers whose owning process on this host has ended.

    For session start: a harness killed outright leaves its containers running, while a
    live session (another xdist worker, a parallel run) keeps its own.
    """
    host = socket.gethostname()
    removed = 0
    for summary in client.api.containers(all=True, filters={"label": f"{MANAGED_LABEL}=1"}):
        owner_host, _, pid = (summary.get("Labels") or {}).get(OWNER_LABEL, "").rpartition(":")
        if owner_host != host or (pid.isdigit() and psutil.pid_exists(int(pid))):
            continue
        removed += _remove(client, summary["Id"])
    return removed


def stop_all() -> None:
    """Stop every container server this process started and has not stopped yet."""
    with _live_lock:
        servers = list(_live.values())
    for server in servers:
        server.stop()


atexit.register(stop_all)
