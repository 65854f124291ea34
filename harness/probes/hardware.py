"""What machine a run is on: CPU model, GPU name, driver and VRAM, host name."""

from __future__ import annotations

import platform
import socket
from collections.abc import Sequence
from pathlib import Path

import pynvml

from harness.probes.devices import Device
from harness.results.model import Hardware


def cpu_model(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """The ``model name`` line of /proc/cpuinfo, with the core count; the machine type else."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return platform.machine() or "unknown CPU"
    names = [line.split(":", 1)[1].strip() for line in text.splitlines()
             if line.startswith("model name") and ":" in line]
    if not names:
        return platform.machine() or "unknown CPU"
    return f"{names[0]} x{len(names)}"


def _nvidia_gpu() -> tuple[str, str, int] | None:
    """Name, driver and VRAM (MiB) of GPU 0 through NVML; None without an NVIDIA driver."""
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no library: not an NVIDIA machine
        return None
    try:
        if pynvml.nvmlDeviceGetCount() == 0:
            return None
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(handle)
        driver = pynvml.nvmlSystemGetDriverVersion()
        memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
        return (_text(name), _text(driver), int(memory.total) // (1024 * 1024))
    except Exception:
        return None
    finally:
        pynvml.nvmlShutdown()


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def detect_hardware(devices: Sequence[Device] = ()) -> Hardware:
    """This machine; ``devices`` are the GPUs the build under test lists (--list-devices).

    NVML is asked first (it also knows the driver); otherwise the build's first device
    names the GPU (ROCm and Vulkan builds list theirs the same way).
    """
    host = socket.gethostname()
    cpu = cpu_model()
    nvidia = _nvidia_gpu()
    if nvidia is not None:
        name, driver, vram = nvidia
        return Hardware(host=host, cpu=cpu, gpu=name, gpu_driver=driver, vram_mib=vram)
    gpus = [d for d in devices if d.backend is not None]
    if gpus:
        first = gpus[0]
        return Hardware(host=host, cpu=cpu, gpu=first.description, vram_mib=first.total_mib)
    return Hardware(host=host, cpu=cpu)
