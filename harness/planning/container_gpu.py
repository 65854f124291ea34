"""Which GPUs a llama-server container is given, from the backend, vendor and main GPU (pure).

A process on the host sees every GPU; a container sees only what it is handed. The
mapping here mirrors each vendor's documented way of handing a GPU to a container:

- CUDA: a device request with the ``gpu`` capability (``docker run --gpus all``), which
  the engine serves through the NVIDIA container toolkit;
- ROCm: the devices ``/dev/kfd`` (the compute interface) and ``/dev/dri`` (the render
  nodes), with the ``video`` and ``render`` groups that own them (AMD's ROCm docker docs);
- Vulkan: ``/dev/dri`` (Mesa drivers: AMD, Intel, and llvmpipe needs none); for an NVIDIA
  card the device request adds the ``graphics`` driver capability, which makes the NVIDIA
  runtime mount its Vulkan ICD into the container.

The device-visibility variables come from the plan's main GPU. They list devices
``0..main_gpu``, not the main GPU alone: the container runs the subprocess runner's
argv unchanged, so ``--main-gpu N`` must still name the same card inside, and
``*_VISIBLE_DEVICES=N`` would renumber it to 0. The configs plan one card
(``split_mode: none``), so the devices after it are hidden without changing the launch.

Nothing here touches the machine: the device paths are parameters, and whether they
exist or the engine has the NVIDIA runtime is checked by ``harness.probes.gpu_access``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from harness.facts.build import Backend
from harness.facts.gpu import Vendor

KFD = Path("/dev/kfd")
DRI = Path("/dev/dri")
#: The capability the engine's NVIDIA device driver answers to (``--gpus`` sends it).
NVIDIA_GPU = "gpu"
#: NVIDIA driver capabilities (NVIDIA_DRIVER_CAPABILITIES) a Vulkan server needs:
#: ``graphics`` brings the Vulkan ICD, ``compute``/``utility`` what CUDA images default to.
NVIDIA_VULKAN_CAPABILITIES: tuple[str, ...] = ("graphics", "compute", "utility")
#: The groups that own /dev/kfd and /dev/dri/renderD* (AMD ROCm container docs).
GPU_GROUPS: tuple[str, ...] = ("video", "render")

#: Device-visibility variables per backend, as each runtime documents them.
VISIBILITY_VARIABLES: Mapping[Backend, tuple[str, ...]] = MappingProxyType({
    Backend.CUDA: ("CUDA_VISIBLE_DEVICES",),
    # HIP's selector, over the devices ROCr left: ROCR_VISIBLE_DEVICES is the ROCm
    # launch environment's, which hides the cards the build has no code for
    # (harness.planning.rocm_env), so the main GPU is counted among the cards it kept.
    Backend.ROCM: ("HIP_VISIBLE_DEVICES",),
    # ggml-vulkan's own selector (ggml-vulkan.cpp); note that naming a device also lets
    # it use a CPU-type device such as llvmpipe, which it skips by default.
    Backend.VULKAN: ("GGML_VK_VISIBLE_DEVICES",),
})


@dataclass(frozen=True)
class DevicePath:
    """A host device (file or folder of device nodes) passed into the container."""

    path: Path
    #: A missing required device is an error; an optional one is left out (llvmpipe
    #: needs no /dev/dri, so a Vulkan run on a machine without a GPU still starts).
    required: bool


@dataclass(frozen=True)
class GpuAccess:
    """What a container of one backend needs to reach its GPU."""

    backend: Backend
    #: Device-request capabilities for the NVIDIA runtime; empty: no NVIDIA request.
    nvidia_capabilities: tuple[str, ...] = ()
    devices: tuple[DevicePath, ...] = ()
    #: Host groups (names) the server joins to open the devices.
    groups: tuple[str, ...] = ()
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def nvidia(self) -> bool:
        return bool(self.nvidia_capabilities)


@dataclass(frozen=True)
class ContainerGpuArgs:
    """A checked :class:`GpuAccess`: present devices and host group ids, ready for docker."""

    nvidia_capabilities: tuple[str, ...] = ()
    #: ``host:container:permissions`` entries, docker's ``--device`` syntax.
    devices: tuple[str, ...] = ()
    group_ids: tuple[int, ...] = ()
    environment: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))

    def to_create_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``containers.create`` (cf. ``ExecConfig.to_exec_run_kwargs``)."""
        kwargs: dict[str, Any] = {}
        if self.nvidia_capabilities:
            # Imported here so the pure planner does not load the Docker SDK for nothing.
            from docker.types import DeviceRequest  # noqa: PLC0415

            # count=-1 is ``--gpus all``; visibility is narrowed by the variables instead,
            # which keeps host numbering (see the module docstring).
            kwargs["device_requests"] = [
                DeviceRequest(count=-1, capabilities=[list(self.nvidia_capabilities)])]
        if self.devices:
            kwargs["devices"] = list(self.devices)
        if self.group_ids:
            kwargs["group_add"] = [str(gid) for gid in self.group_ids]
        return kwargs


def visible_devices(main_gpu: int | None) -> str | None:
    """The visibility list for a plan's main GPU: ``0..main_gpu``, or None for all."""
    if main_gpu is None:
        return None
    if main_gpu < 0:
        raise ValueError(f"main_gpu must be >= 0, got {main_gpu}")
    return ",".join(str(index) for index in range(main_gpu + 1))


def plan_gpu_access(backend: Backend, *, vendor: Vendor | None = None,
                    main_gpu: int | None = None, kfd: Path = KFD,
                    dri: Path = DRI) -> GpuAccess | None:
    """The access a ``backend`` server needs; None for the CPU backend (no device)."""
    if backend is Backend.CPU:
        return None
    visible = visible_devices(main_gpu)
    environment = ({name: visible for name in VISIBILITY_VARIABLES[backend]}
                   if visible is not None else {})
    if backend is Backend.CUDA:
        return GpuAccess(backend, nvidia_capabilities=(NVIDIA_GPU,),
                         environment=MappingProxyType(environment))
    if backend is Backend.ROCM:
        return GpuAccess(backend, devices=(DevicePath(kfd, True), DevicePath(dri, True)),
                         groups=GPU_GROUPS, environment=MappingProxyType(environment))
    # Vulkan: the render nodes for Mesa drivers; NVIDIA's Vulkan driver comes with the
    # NVIDIA runtime instead, asked for through the graphics capability.
    capabilities = ((NVIDIA_GPU, *NVIDIA_VULKAN_CAPABILITIES)
                    if vendor is Vendor.NVIDIA else ())
    return GpuAccess(backend, nvidia_capabilities=capabilities,
                     devices=(DevicePath(dri, vendor not in (None, Vendor.NVIDIA)),),
                     groups=GPU_GROUPS, environment=MappingProxyType(environment))

