"""What the build under test sees of this machine's GPUs, and the environment a ROCm
build is launched with so that it sees only the cards it has code for.

Both run the build's own ``--list-devices``: on the host, or inside a container of the
run's image with the GPU access the container runner gives its servers (a container
build's binary exists only in its image).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from harness.builds.container_build import image_backend
from harness.builds.under_test import BuildUnderTest
from harness.facts.build import Backend
from harness.planning.container_gpu import ContainerGpuArgs, plan_gpu_access
from harness.planning.rocm_env import RocmLaunchEnv
from harness.probes.devices import Device, list_devices, list_devices_in_image
from harness.probes.docker_engine import docker_engine
from harness.probes.gpu_access import check_gpu_access
from harness.probes.rocm_launch import image_rocm_env, native_rocm_env


def devices_seen(build: BuildUnderTest, image: str | None,
                 extra_env: Mapping[str, str]) -> tuple[Device, ...]:
    """The GPU devices ``build`` (or the server in ``image``) lists, launched with
    ``extra_env`` on top of what its servers get anyway."""
    if image is None:
        return list_devices(build.binary, {**os.environ, **extra_env} if extra_env else None)
    client = docker_engine()
    try:
        return list_devices_in_image(client, image, _image_gpu_args(client, image), extra_env)
    finally:
        client.close()


def plan_launch_env(build: BuildUnderTest, image: str | None) -> RocmLaunchEnv | None:
    """The launch environment of a ROCm build (``harness.planning.rocm_env``); None for
    the other backends, which launch with none."""
    if image is None:
        return (native_rocm_env(build.binary, build.info, os.environ)
                if build.backend is Backend.ROCM else None)
    client = docker_engine()
    try:
        if image_backend(client, image) is not Backend.ROCM:
            return None
        # The build's recorded targets hold for its own image only.
        info = build.info if build.info is not None and build.info.image == image else None
        return image_rocm_env(client, image, _image_gpu_args(client, image), info, {})
    finally:
        client.close()


def _image_gpu_args(client: Any, image: str) -> ContainerGpuArgs | None:
    """The GPU access the container runner gives ``image``'s servers (main GPU 0)."""
    access = plan_gpu_access(image_backend(client, image), main_gpu=0)
    runtimes = (client.info().get("Runtimes") or {}) if access is not None else {}
    return check_gpu_access(access, runtimes) if access is not None else None
