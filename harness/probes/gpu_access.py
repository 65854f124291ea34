"""Checks that this machine can give a container the GPU access a plan asks for.

``harness.planning.container_gpu`` says what a backend's container needs; this module
looks at the machine: the engine's runtimes, the device paths, the groups that own them.
Every failure is a :class:`ConfigError` naming the missing piece and how to add it. The
device paths come from the :class:`GpuAccess` and the lookups are parameters, so the
checks run against temporary files in tests.
"""

from __future__ import annotations

import grp
import os
from collections.abc import Callable, Collection
from pathlib import Path
from types import MappingProxyType

from harness.errors import ConfigError
from harness.planning.container_gpu import ContainerGpuArgs, GpuAccess

NVIDIA_TOOLKIT_HINT = (
    "install the NVIDIA container toolkit (nvidia-container-toolkit) and register its "
    "runtime with `nvidia-ctk runtime configure --runtime=docker`, then restart dockerd")
#: The runtime name ``nvidia-ctk runtime configure`` registers with the engine.
NVIDIA_RUNTIME = "nvidia"


def host_group_id(name: str) -> int | None:
    """The host's id for group ``name``, or None when the host has no such group."""
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        return None


def readable_and_writable(path: Path) -> bool:
    """Whether this process may open ``path`` for reading and writing (as ROCm does)."""
    return os.access(path, os.R_OK | os.W_OK)


def check_gpu_access(
    access: GpuAccess,
    engine_runtimes: Collection[str],
    *,
    group_id: Callable[[str], int | None] = host_group_id,
    accessible: Callable[[Path], bool] = readable_and_writable,
) -> ContainerGpuArgs:
    """Check ``access`` against this machine and resolve it into docker arguments.

    ``engine_runtimes`` are the names in the engine's ``docker info`` ``Runtimes``.
    Groups are passed by host id, not by name: docker resolves names in the image's
    ``/etc/group``, where ``render`` is often missing, while the device nodes belong to
    the host's ids.
    """
    if access.nvidia and NVIDIA_RUNTIME not in engine_runtimes:
        known = ", ".join(sorted(engine_runtimes)) or "none"
        raise ConfigError(
            f"the {access.backend.value} container needs NVIDIA GPUs, but the Docker engine "
            f"has no {NVIDIA_RUNTIME!r} runtime (it has: {known}); {NVIDIA_TOOLKIT_HINT}")
    groups = ", ".join(access.groups) or "none"
    devices: list[str] = []
    for device in access.devices:
        if not device.path.exists():
            if device.required:
                raise ConfigError(
                    f"the {access.backend.value} container needs {device.path}, which does "
                    f"not exist on this machine: load the GPU's kernel driver (amdgpu for "
                    f"ROCm) or run on a machine with the GPU (groups: {groups})")
            continue
        nodes = _device_nodes(device.path)
        if device.required and nodes and not any(accessible(node) for node in nodes):
            raise ConfigError(
                f"{nodes[0]} exists but this user cannot open it for reading and "
                f"writing; add the user to the groups that own it ({groups}), e.g. "
                f"`usermod -aG {','.join(access.groups) or 'video'} $USER`, and log in again")
        devices.append(f"{device.path}:{device.path}:rwm")
    group_ids = tuple(dict.fromkeys(
        gid for gid in (group_id(name) for name in access.groups) if gid is not None))
    return ContainerGpuArgs(
        nvidia_capabilities=access.nvidia_capabilities,
        devices=tuple(devices),
        # Without a device there is nothing for the groups to open.
        group_ids=group_ids if devices else (),
        environment=MappingProxyType(dict(access.environment)),
    )


def _device_nodes(path: Path) -> list[Path]:
    """The nodes a server opens under ``path``: the file itself, or a folder's render nodes.

    ``/dev/dri`` itself is a root-owned folder; what the groups grant is access to the
    ``renderD*`` nodes in it.
    """
    if path.is_dir():
        return sorted(path.glob("renderD*"))
    return [path]
