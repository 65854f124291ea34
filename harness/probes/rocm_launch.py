"""A ROCm build's launch environment, from what its own device probe lists.

The build lists its devices once as the host has them (``--list-devices``; ggml-cuda's
init names each card's gfx target on stderr), ``harness.planning.rocm_env`` decides what
to hide from the build's recorded targets, and the caller then lists the devices again
with that environment: what the planner reads is what the launched server will see.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.facts.build import BuildInfo
from harness.planning.container_gpu import ContainerGpuArgs
from harness.planning.rocm_env import (
    RocmLaunchEnv,
    build_targets,
    parse_rocm_devices,
    plan_rocm_env,
)
from harness.probes.devices import list_devices_output_in_image, run_list_devices

#: Where a relocatable ROCm build keeps its own rocBLAS kernel packs, beside the binary
#: (the layout of AMD's and llama.cpp's release archives: ``rocblas/library``).
KERNEL_PACKS_DIR = Path("rocblas") / "library"


def native_rocm_env(binary: Path, info: BuildInfo | None,
                    environ: Mapping[str, str]) -> RocmLaunchEnv:
    """The launch environment of the ROCm ``binary`` on this host (``environ``: the
    environment its server would inherit)."""
    listing = run_list_devices(binary, environ)
    packs = binary.parent / KERNEL_PACKS_DIR
    return plan_rocm_env(build_targets(info.cmake_flags if info else ()),
                         parse_rocm_devices(listing.stdout + "\n" + listing.stderr),
                         inherited=environ, kernel_packs=str(packs) if packs.is_dir() else None)


def image_rocm_env(client: Any, image: str, gpu: ContainerGpuArgs | None,
                   info: BuildInfo | None, runner_env: Mapping[str, str]) -> RocmLaunchEnv:
    """The launch environment of the ROCm server in ``image``, given the GPU access and
    the variables (``runner_env``) its containers get. The image's rocBLAS is Debian's,
    found where it is installed: no kernel packs are routed."""
    # Listed without the GPU access's HIP_VISIBLE_DEVICES: that is the runner's main-GPU
    # selection, made over what ROCr leaves (container_gpu.py), and the hiding is decided
    # in the host's numbering. Nor is it a user's choice of devices: only the runner's
    # own variables can be that.
    every_device = replace(gpu, environment=MappingProxyType({})) if gpu is not None else None
    output = list_devices_output_in_image(client, image, every_device, runner_env)
    return plan_rocm_env(build_targets(info.cmake_flags if info else ()),
                         parse_rocm_devices(output), inherited=runner_env)
