"""Which GPUs a backend can use on this runner: each vendor's tool, asked (thin I/O).

NVML (``pynvml``) for CUDA; AMD SMI for ROCm (the ``amdsmi`` Python module when it
imports, else ``rocm-smi --json``); ``vulkaninfo --summary`` for Vulkan. This module
only runs the tool; what its answer means, and the fix when it names no usable GPU, is
read by the pure functions of ``harness.probes.gpu_tool_readers``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import shutil
import subprocess
from typing import Any

import pynvml

from harness.facts.build import Backend
from harness.probes.gpu_tool_readers import (
    AMDSMI,
    ROCM_SMI,
    ROCM_SMI_ARGV,
    VULKANINFO,
    VULKANINFO_ARGV,
    GpuHealth,
    amd_health,
    amdsmi_failure,
    amdsmi_gpus,
    nvml_answer,
    nvml_failure,
    rocm_smi_health,
    unusable,
    vulkan_health,
)

#: A tool that answers at all answers in seconds; one that hangs is a broken driver.
TOOL_TIMEOUT_S = 60.0


def probe_gpus(backend: Backend, *, allow_software: bool = False) -> GpuHealth:
    """Ask this machine's vendor tool which ``backend`` GPUs it has (GPU backends only)."""
    if backend is Backend.CUDA:
        return probe_nvml()
    if backend is Backend.ROCM:
        return probe_amd()
    if backend is Backend.VULKAN:
        return probe_vulkan(allow_software=allow_software)
    raise ValueError(f"{backend.value} is not a GPU backend; allowed: cuda, rocm, vulkan")


@functools.cache
def runner_gpu_health(backend: Backend) -> GpuHealth:
    """:func:`probe_gpus`, asked once per process: a runner's GPUs do not change during a
    run, and the plugin asks for every ``gpu``-marked test."""
    return probe_gpus(backend)


def probe_nvml(nvml: Any = pynvml) -> GpuHealth:
    try:
        nvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return nvml_failure(exc.value, str(exc))
    try:
        return nvml_answer(nvml)
    except pynvml.NVMLError as exc:
        return nvml_failure(exc.value, str(exc))
    finally:
        nvml.nvmlShutdown()


def probe_amd() -> GpuHealth:
    """AMD SMI's Python module when it imports (ROCm 6+), else the rocm-smi command."""
    try:
        amdsmi = importlib.import_module("amdsmi")
    except ImportError:
        return _probe_rocm_smi()
    try:
        amdsmi.amdsmi_init()
    except Exception as exc:  # AmdSmiLibraryException: no driver, no device node
        return amdsmi_failure(str(exc))
    try:
        return amd_health(amdsmi_gpus(amdsmi), AMDSMI)
    except Exception as exc:
        return unusable(Backend.ROCM, AMDSMI, f"AMD SMI failed while listing GPUs ({exc})",
                        "run `amd-smi list` on this runner and fix what it reports")
    finally:
        # Best effort, as every optional AMD SMI call: its own exception types.
        with contextlib.suppress(Exception):
            amdsmi.amdsmi_shut_down()


def _probe_rocm_smi() -> GpuHealth:
    if shutil.which(ROCM_SMI_ARGV[0]) is None:
        return unusable(Backend.ROCM, ROCM_SMI,
                        "neither the amdsmi Python module nor rocm-smi is installed, so no "
                        "AMD GPU can be listed",
                        "install ROCm's SMI (Debian: `apt-get install rocm-smi`; ROCm 6+: "
                        "the amdsmi Python package from /opt/rocm/share/amd_smi)")
    done = _run(ROCM_SMI_ARGV, Backend.ROCM)
    if isinstance(done, GpuHealth):
        return done
    return rocm_smi_health(*done)


def probe_vulkan(*, allow_software: bool = False) -> GpuHealth:
    if shutil.which(VULKANINFO_ARGV[0]) is None:
        return unusable(Backend.VULKAN, VULKANINFO,
                        "vulkaninfo is not installed, so no Vulkan device can be listed",
                        "install it with `apt-get install vulkan-tools`")
    done = _run(VULKANINFO_ARGV, Backend.VULKAN)
    if isinstance(done, GpuHealth):
        return done
    return vulkan_health(*done, allow_software=allow_software)


def _run(argv: tuple[str, ...], backend: Backend) -> tuple[str, str, int] | GpuHealth:
    """(stdout, stderr, exit code), or the health of a tool that did not run at all."""
    shown = " ".join(argv)
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True,
                              timeout=TOOL_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return unusable(backend, argv[0],
                        f"`{shown}` did not finish in {TOOL_TIMEOUT_S:.0f} s: the GPU driver "
                        "hangs", "check `dmesg` and reboot the runner")
    except OSError as exc:
        return unusable(backend, argv[0], f"`{shown}` did not run ({exc})",
                        f"reinstall {argv[0]}")
    return proc.stdout, proc.stderr, proc.returncode
