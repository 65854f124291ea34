"""The GPU drivers' on-disk caches for servers in containers: one host folder, kept.

A driver compiles a server's shaders and kernels on first use and keeps them on disk
(Mesa's shader cache, NVIDIA's GL/Vulkan shader cache, CUDA's JIT cache). On a host
that cache outlives the process; in a container started with ``--rm`` it would die with
it, so every container start paid for the compilation again. On Mesa's software Vulkan
driver (llvmpipe) that is about 21 s before the server is ready and 14 s more on the
first completion, against 0.6 s and 0.1 s with a warm cache (measured here on the
Vulkan image, the dense fixture). The harness mounts one host folder, read-write, into
every server container and points each driver's cache variable into it, so a container
start costs what a host's second start costs. The drivers key their entries by driver
build and device, so one folder serves every image.

``HARNESS_DRIVER_CACHE``: unset or empty, ``$HARNESS_CACHE/driver-cache``; ``off``, no
mount (each start compiles from scratch, the way a fresh runner would); else the folder.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from harness.paths import cache_root

DRIVER_CACHE_ENV = "HARNESS_DRIVER_CACHE"
#: Where the host folder is mounted in the container.
MOUNT_POINT = "/var/cache/harness-driver"
#: Each driver's cache variable and its subfolder of the mount.
CACHE_VARIABLES = {
    "MESA_SHADER_CACHE_DIR": "mesa",
    "__GL_SHADER_DISK_CACHE_PATH": "nvidia-shaders",
    "CUDA_CACHE_PATH": "cuda-jit",
}
_OFF = "off"


def driver_cache_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The host folder to mount, or None where ``HARNESS_DRIVER_CACHE=off``."""
    env = os.environ if environ is None else environ
    value = env.get(DRIVER_CACHE_ENV, "").strip()
    if value.lower() == _OFF:
        return None
    if not value:
        return cache_root(env) / "driver-cache"
    return Path(value).expanduser().absolute()


def driver_cache_environment() -> dict[str, str]:
    """The container's variables that point each driver's cache into the mount."""
    return {name: f"{MOUNT_POINT}/{folder}" for name, folder in CACHE_VARIABLES.items()}
