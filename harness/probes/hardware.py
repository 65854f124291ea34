"""What machine a run is on: CPU model, GPU name, driver and VRAM, host name."""

from __future__ import annotations

import platform
import socket
from collections.abc import Sequence
from pathlib import Path

from harness.facts.build import Backend
from harness.probes.devices import Device
from harness.probes.gpu_health import runner_gpu_health
from harness.results.run_record import Hardware


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


def detect_hardware(devices: Sequence[Device] = ()) -> Hardware:
    """This machine; ``devices`` are the GPUs the build under test lists (--list-devices).

    NVML is asked first, through the runner's GPU health probe (asked once per process;
    it also knows the driver); otherwise the build's first device names the GPU (ROCm and
    Vulkan builds list theirs the same way).
    """
    host = socket.gethostname()
    cpu = cpu_model()
    nvidia = runner_gpu_health(Backend.CUDA).gpus
    if nvidia:
        first_gpu = nvidia[0]
        return Hardware(host=host, cpu=cpu, gpu=first_gpu.name, gpu_driver=first_gpu.driver,
                        vram_mib=first_gpu.total_mib)
    gpus = [d for d in devices if d.backend is not None]
    if gpus:
        first = gpus[0]
        return Hardware(host=host, cpu=cpu, gpu=first.description, vram_mib=first.total_mib)
    return Hardware(host=host, cpu=cpu)
