"""llama-server in a Docker container, as a testcontainers module, its log followed.

:class:`LlamaServerContainer` is in the shape of the library's own modules
(``OllamaContainer`` and friends): the image's entrypoint is the server and the
container command is its arguments. It knows docker, not the harness's server surface:
:mod:`harness.runners.container_runner` wraps it as a ``RunningServer``.

- Networking: the host's (``network_mode="host"``, no published ports; the engine runs
  with ``--bridge=none``); the server's ``listening on http://127.0.0.1:PORT`` line names
  the port it was given with ``--port 0``.
- Log: a background thread follows the container's log stream into a file, flushed
  chunk by chunk, so the readiness wait, the verdicts and a failure message read the
  same file they read for a child process.
- Exit status: known once the log stream has ended and docker reports the status, so a
  failure message always holds the last lines. Docker reports a process killed by signal
  N as 128+N; it is turned into -N, the subprocess convention. Every wait on the engine
  has a bound (``FOLLOWER_JOIN_S``, ``STATUS_WAIT_S``): an engine that stops answering
  ends in a removal by force, not a hang.
- Stopping is SIGTERM, the grace period, SIGKILL (``docker stop``), then removal. Every
  container carries the harness's labels (:mod:`harness.runners.container_labels`), so a
  sweep finds those a killed harness left behind.
"""

from __future__ import annotations

import contextlib
import math
import signal
import threading
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import requests
from docker.errors import APIError, DockerException, ImageNotFound, NotFound
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from harness.errors import ConfigError, ServerError
from harness.planning.container_gpu import ContainerGpuArgs
from harness.runners.container_labels import harness_labels
from harness.runners.launching import DEFAULT_STOP_GRACE_S, LOOPBACK, announced_port

#: Docker reports "killed by signal N" as 128+N (the shell convention); N is at most
#: SIGRTMAX on Linux.
_SIGNAL_BASE = 128
_MAX_SIGNAL = int(signal.SIGRTMAX)
#: How long stop() waits for the log follower to drain after the container ended; then
#: the log stream is closed under it (an engine that never ends a finished container's
#: log stream is a known docker failure).
FOLLOWER_JOIN_S = 30.0
#: Seconds to wait for docker to report an ended container's exit status.
STATUS_WAIT_S = 30.0
#: A partial log line longer than this is not a ``listening on`` line; keep memory bounded.
_MAX_PARTIAL_LINE = 4096


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


def _disable_ryuk() -> None:
    # testcontainers' reaper (Ryuk) is an image pulled from Docker Hub, which these
    # engines cannot reach; the harness reaps its own containers by label instead. The
    # config's attribute wins over TESTCONTAINERS_RYUK_DISABLED whenever it was read, so
    # this process's environment is left as it was (a child of a test sees what it set).
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
        writable_mounts: Mapping[Path, str] | None = None,
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
        for host, inside in (writable_mounts or {}).items():
            self.with_volume_mapping(str(host), inside, "rw")
        self._kwargs = {
            **self._kwargs,
            "network_mode": "host",
            # An explicit (empty) network keeps testcontainers from looking for a
            # docker-in-docker network, which would override host networking.
            "network": None,
            "labels": {**(labels or {}), **harness_labels()},
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
        #: The followed log stream, closed by stop() when it does not end by itself.
        self._log_stream: Any = None
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
            self._log_stream = container.logs(stream=True, follow=True)
            with self.log_path.open("ab") as log:
                for chunk in self._log_stream:
                    log.write(chunk)
                    # Flushed per chunk: readiness and failure messages read the file.
                    log.flush()
                    if self._port is None:
                        # Only complete lines are searched, so a port split across two
                        # chunks is never read as its first digits.
                        complete, _, partial = (partial + chunk).rpartition(b"\n")
                        self._port = announced_port(complete)
                        partial = partial[-_MAX_PARTIAL_LINE:]
        except (DockerException, requests.RequestException):
            pass  # removed under the stream (a sweep), or closed by stop(); status below
        finally:
            status = wait_status(container)
            # No status in time: the engine is not answering; stop() settles it.
            if status is not None:
                self._status = status
                self._ended.set()

    def _end_follower(self) -> None:
        """Let the log follower drain, for ``FOLLOWER_JOIN_S`` at most, then close its stream."""
        follower = self._follower
        if follower is None:
            return
        follower.join(FOLLOWER_JOIN_S)
        if follower.is_alive() and self._log_stream is not None:
            with contextlib.suppress(DockerException, OSError):
                self._log_stream.close()  # shuts the socket down: the blocked read returns
            follower.join(STATUS_WAIT_S)

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
                with contextlib.suppress(NotFound, requests.RequestException):
                    # The client's timeout bounds this past the grace; removal kills.
                    container.stop(timeout=math.ceil(self.stop_grace_s))
                self._end_follower()
                status = None if self._ended.is_set() else wait_status(container)
                try:
                    container.remove(force=force, v=delete_volume)
                except APIError as exc:
                    # 404: already gone; 409: a sweep is removing it right now.
                    if exc.status_code not in (404, 409):
                        raise
                finally:
                    if not self._ended.is_set():
                        # No status from the engine in time: removed by force, which kills.
                        self._status = -signal.SIGKILL if status is None else status
                        self._ended.set()
            self._removed = True
            self.get_docker_client().client.close()

    def _short_id(self) -> str:
        container = self._container
        return container.short_id if container is not None else "(not started)"


def wait_status(container: Any) -> int | None:
    """An ended container's exit status (subprocess convention), -SIGKILL when it is gone
    (removed by force, which kills), None when docker does not say within
    ``STATUS_WAIT_S``."""
    try:
        answer = container.wait(timeout=STATUS_WAIT_S)
        return status_from_docker(int(answer["StatusCode"]))
    except DockerException:
        return -signal.SIGKILL
    except requests.RequestException:
        return None
