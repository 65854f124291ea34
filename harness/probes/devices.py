"""The GPU devices a llama-server build sees, from its own ``--list-devices``.

common/arg.cpp prints ``Available devices:`` then one ``  <name>: <description> (<total>
MiB, <free> MiB free)`` line per non-CPU device, or ``  (none)``. The device name's
prefix is the backend (``CUDA0``, ``ROCm0``, ``Vulkan0``, ``SYCL0``, ``MTL0``).

A GPU build on a machine without its GPU lists ``(none)``, but says what it is on stderr
while its backend registers: ggml-cuda's ``ggml_cuda_init`` logs ``failed to initialize
CUDA: …`` (``ROCm`` for a HIP build: ``GGML_CUDA_NAME``) at error level, which the default
verbosity prints; ggml-vulkan's ``ggml_vulkan: …`` lines are info level and show only when
a Vulkan device is found. ``infer_backend`` reads both.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
from docker.errors import DockerException

from harness.errors import BuildError
from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo
from harness.planning.container_gpu import ContainerGpuArgs

_DEVICE = re.compile(r"^\s+(?P<name>(?P<prefix>[A-Za-z]+)\d+): (?P<description>.*) "
                     r"\((?P<total>\d+) MiB, (?P<free>\d+) MiB free\)\s*$")
#: ggml backend name prefixes → our backend words.
_PREFIX_BACKEND = {"CUDA": Backend.CUDA, "ROCm": Backend.ROCM, "Vulkan": Backend.VULKAN}
#: Lines a backend prints while it registers, whether or not it finds a device:
#: ggml/src/ggml-cuda/ggml-cuda.cu ``ggml_cuda_init`` ("%s: failed to initialize "
#: GGML_CUDA_NAME ": %s", "%s: found %d " GGML_CUDA_NAME " devices") and ggml-vulkan.cpp's
#: ``ggml_vulkan: `` prefix.
_INIT_LINE = re.compile(
    r"ggml_cuda_init: (?:failed to initialize|found \d+) (?P<name>CUDA|ROCm)\b"
    r"|(?P<vulkan>ggml_vulkan: )")
_INIT_BACKEND = {"CUDA": Backend.CUDA, "ROCm": Backend.ROCM}
#: Seconds ``--list-devices`` may take, on the host or in a container: a second or two,
#: longer while a GPU driver initialises; past this the driver is hung.
LIST_DEVICES_LIMIT_S = 120.0


@dataclass(frozen=True)
class Device:
    name: str
    backend: Backend | None
    description: str
    total_mib: int
    free_mib: int

    def gpu_info(self) -> GpuInfo:
        return GpuInfo(name=self.description, vram_mib=self.total_mib, backend=self.backend)


def parse_device_list(text: str) -> tuple[Device, ...]:
    devices = []
    for line in text.splitlines():
        match = _DEVICE.match(line)
        if match:
            devices.append(Device(
                name=match["name"], backend=_PREFIX_BACKEND.get(match["prefix"]),
                description=match["description"], total_mib=int(match["total"]),
                free_mib=int(match["free"])))
    return tuple(devices)


def infer_backend(devices: tuple[Device, ...], *outputs: str) -> Backend:
    """The backend a binary was built for, from what it listed and printed (pure).

    A listed device names it; else a backend's init line in ``outputs`` (``--list-devices``
    and ``--version`` text, stderr included); when nothing says, CPU. A Vulkan build on a
    machine with no Vulkan GPU prints nothing at the default verbosity, so it reads as CPU.
    """
    for device in devices:
        if device.backend is not None:
            return device.backend
    for text in outputs:
        for match in _INIT_LINE.finditer(text):
            return Backend.VULKAN if match["vulkan"] else _INIT_BACKEND[match["name"]]
    return Backend.CPU


@dataclass(frozen=True)
class DeviceListing:
    """One ``--list-devices`` run: its exit code and everything it printed."""

    returncode: int
    stdout: str
    stderr: str

    @property
    def listed(self) -> bool:
        return self.returncode == 0 and "Available devices:" in self.stdout

    def devices(self) -> tuple[Device, ...]:
        return parse_device_list(self.stdout)


def run_list_devices(binary: Path, env: Mapping[str, str] | None = None,
                     extra_args: Sequence[str] = ()) -> DeviceListing:
    """Run ``binary --list-devices`` (``env``: its whole environment, None: this
    process's; ``extra_args``: e.g. ``--rpc HOST:PORT,...`` to list RPC devices too);
    BuildError only when it cannot run at all."""
    try:
        proc = subprocess.run([str(binary), *extra_args, "--list-devices"], capture_output=True,
                              text=True,
                              timeout=LIST_DEVICES_LIMIT_S, check=False, errors="replace",
                              env=None if env is None else dict(env))
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise BuildError(f"{binary} --list-devices did not run: {exc}") from exc
    return DeviceListing(proc.returncode, proc.stdout, proc.stderr)


def list_devices(binary: Path, env: Mapping[str, str] | None = None) -> tuple[Device, ...]:
    listing = run_list_devices(binary, env)
    if not listing.listed:
        raise BuildError(f"{binary} --list-devices failed (exit {listing.returncode}): "
                         f"{(listing.stdout + listing.stderr)[-1000:]}")
    return listing.devices()


def list_devices_in_image(client: Any, image: str, gpu: ContainerGpuArgs | None,
                          extra_env: Mapping[str, str] | None = None) -> tuple[Device, ...]:
    """``--list-devices`` of the server inside ``image``, given the GPU access its runs get.

    A container build's binary exists only in its image, so the host cannot run it; the
    same device requests, device nodes, groups and launch environment (``extra_env``) as
    the container runner's mean the listing sees what the suites' servers will see.
    """
    return parse_device_list(list_devices_output_in_image(client, image, gpu, extra_env))


def list_devices_output_in_image(client: Any, image: str, gpu: ContainerGpuArgs | None,
                                 extra_env: Mapping[str, str] | None = None) -> str:
    """Everything ``--list-devices`` printed in a container of ``image`` (the device list
    and the backends' init lines); BuildError when it printed no device list."""
    kwargs = gpu.to_create_kwargs() if gpu is not None else {}
    environment = {**(gpu.environment if gpu is not None else {}), **(extra_env or {})}
    try:
        # Not containers.run without detach: it follows the log and waits with no end.
        container = client.containers.create(image, ["--list-devices"], network_mode="host",
                                             environment=environment, **kwargs)
    except DockerException as exc:
        raise BuildError(_in_container_failed(image, exc)) from exc
    try:
        container.start()
        container.wait(timeout=LIST_DEVICES_LIMIT_S)
        output = container.logs(stdout=True, stderr=True)
    except DockerException as exc:
        raise BuildError(_in_container_failed(image, exc)) from exc
    except requests.RequestException as exc:
        raise BuildError(f"{image} --list-devices did not finish in a container within "
                         f"{LIST_DEVICES_LIMIT_S:g} s (harness.probes.devices."
                         f"LIST_DEVICES_LIMIT_S): {exc}; a GPU driver that hangs while it "
                         "initialises does this: `harness doctor --backend <backend>`") from exc
    finally:
        _remove(container)
    text = output.decode("utf-8", "replace") if isinstance(output, bytes) else str(output)
    if "Available devices:" not in text:
        raise BuildError(f"{image} --list-devices printed no device list: {text[-1000:]}")
    return text


def _in_container_failed(image: str, exc: Exception) -> str:
    return (f"{image} --list-devices failed in a container: {exc}; check the image with "
            "`harness images` and the GPU access with `harness doctor --backend <backend>`")


def _remove(container: Any) -> None:
    # By force: it kills a listing still running. An engine that does not answer within
    # its client's own timeout leaves the container behind, not a hung probe.
    with contextlib.suppress(DockerException, requests.RequestException):
        container.remove(force=True)
