"""The Docker engine the container paths use, or an error that says how to start one."""

from __future__ import annotations

from typing import Any

import docker
from docker.errors import DockerException

from harness.errors import ConfigError

START_HINT = ("start one as root with `dockerd --bridge=none --iptables=false &` "
              "(Debian: `apt-get install docker.io`), or point DOCKER_HOST at a running engine")


def docker_engine() -> Any:
    """A connected ``docker.DockerClient``; ConfigError when no engine answers."""
    try:
        client = docker.from_env()
        client.ping()
    except DockerException as exc:
        raise ConfigError(f"no Docker engine answers ({exc}); {START_HINT}") from exc
    return client


def engine_unavailable() -> str | None:
    """Why container tests cannot run here, or None when an engine answers."""
    try:
        docker_engine().close()
    except ConfigError as exc:
        return str(exc)
    return None
