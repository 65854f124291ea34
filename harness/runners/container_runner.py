"""Runs llama-server in a Docker container, as a ``RunningServer`` like a child process.

:class:`ContainerRunner` and :class:`ContainerServer` put a
:class:`~harness.runners.llama_server_container.LlamaServerContainer` behind the
harness's server seam (:mod:`harness.runners.base`), so a suite runs unchanged on a
server in a container.

- Files: the spec's model, drafter and every other path are bind-mounted read-only at
  their own absolute paths, so the argv is the subprocess runner's, byte for byte, bar
  the binary (the image's ``/app/llama-server``).
- Driver caches: one host folder is mounted read-write for the GPU drivers' shader and
  kernel caches (:mod:`harness.runners.driver_cache`), so a start compiles only what no
  earlier start compiled, as on a host.
- Log: the container's log is followed into a per-server file in ``log_dir``, named as
  a child process's would be.
- Cleanup: every server is tracked (:mod:`harness.runners.live`) and stopped at
  interpreter exit; :mod:`harness.runners.container_sweep` removes leftovers of a
  harness that was killed outright.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

from docker.errors import DockerException, ImageNotFound

from harness.errors import ConfigError
from harness.planning.container_gpu import GpuAccess
from harness.planning.container_plan import SERVER_PATH_IN_IMAGE
from harness.planning.launch import LaunchSpec
from harness.probes.docker_engine import docker_engine
from harness.probes.gpu_access import check_gpu_access
from harness.runners.base import WaitCondition
from harness.runners.driver_cache import MOUNT_POINT, driver_cache_dir, driver_cache_environment
from harness.runners.launching import (
    DEFAULT_READY_TIMEOUT_S,
    DEFAULT_STOP_GRACE_S,
    PreparedLaunch,
    launch_server,
    read_log_tail,
    read_log_text,
    until_ready,
)
from harness.runners.live import forget
from harness.runners.llama_server_container import LlamaServerContainer, image_missing_message
from harness.runners.observe import notify_stopping
from harness.runners.readiness import default_conditions


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
        return read_log_text(self.log_path)

    def stop(self) -> int | None:
        """Stop and remove the container; idempotent. Returns the exit status."""
        try:
            if self._container.exit_status() is None:
                notify_stopping(self)
            self._container.stop()
        finally:
            forget(self)
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
        #: The drivers' shader and kernel caches, kept across starts (None: not mounted).
        self.driver_cache = driver_cache_dir()

    def launch(self, spec: LaunchSpec) -> ContainerServer:
        """Start the container and return at once, without waiting for readiness."""
        # Made absolute before the argv is built: the container's working folder differs.
        return launch_server(absolute_paths(spec), self._spawn, binary=SERVER_PATH_IN_IMAGE,
                             log_dir=self.log_dir, default_threads=self.default_threads)

    def start(self, spec: LaunchSpec) -> ContainerServer:
        """Start a server and wait until it serves; on any failure it is stopped first."""
        return until_ready(self, self.launch(spec))

    def _spawn(self, launch: PreparedLaunch) -> ContainerServer:
        # Created before the container starts: readers find the file at once, and the
        # log follower appends to it.
        launch.log_path.write_bytes(b"")
        writable: dict[Path, str] = {}
        cache_env: dict[str, str] = {}
        if self.driver_cache is not None:
            self.driver_cache.mkdir(parents=True, exist_ok=True)
            writable[self.driver_cache] = MOUNT_POINT
            cache_env = driver_cache_environment()
        environment = {**cache_env, **(self.gpu_args.environment if self.gpu_args else {}),
                       **self.env}
        container = LlamaServerContainer(
            self.image, launch.argv[1:], launch.log_path, mounts=spec_mounts(launch.spec),
            writable_mounts=writable, env=environment, gpu=self.gpu_args,
            stop_grace_s=self.stop_grace_s)
        container.start()
        return ContainerServer(container, launch.argv)
