"""What machine a run is on: the CPU from a cpuinfo file, the GPU from the build's devices."""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

import pytest

from harness.facts.build import Backend
from harness.probes import gpu_tool_readers, hardware
from harness.probes.devices import Device
from harness.probes.gpu_health import runner_gpu_health
from harness.probes.hardware import cpu_model, detect_hardware

EPYC = "AMD EPYC 7763 64-Core Processor"
RADEON = Device(name="Vulkan0", backend=Backend.VULKAN,
                description="AMD Radeon RX 7900 XTX (RADV NAVI31)", total_mib=24560,
                free_mib=23000)


NO_NVML = pytest.mark.skipif(bool(runner_gpu_health(Backend.CUDA).gpus),
                             reason="NVML names the GPU on this machine")


def _cpuinfo(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(text)
    return path


def test_cpu_model_names_the_model_and_counts_the_cpus(tmp_path: Path) -> None:
    text = "".join(f"processor\t: {i}\nvendor_id\t: AuthenticAMD\nmodel name\t: {EPYC}\n"
                   "flags\t\t: fpu vme\n\n" for i in range(2))
    assert cpu_model(_cpuinfo(tmp_path, text)) == f"{EPYC} x2"


def test_cpu_model_without_a_model_name_is_the_machine_type(tmp_path: Path) -> None:
    # ARM kernels print no "model name" line.
    text = "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\n"
    assert cpu_model(_cpuinfo(tmp_path, text)) == (platform.machine() or "unknown CPU")


def test_cpu_model_without_a_cpuinfo_file_is_the_machine_type(tmp_path: Path) -> None:
    assert cpu_model(tmp_path / "missing") == (platform.machine() or "unknown CPU")


@pytest.mark.skipif(platform.machine() not in ("x86_64", "i686"),
                    reason="only x86 kernels print a 'model name' line per CPU")
def test_cpu_model_of_this_machine_counts_its_cpus() -> None:
    # Checked against the kernel's own CPU count, not against /proc/cpuinfo again.
    name, _, count = cpu_model().rpartition(" x")
    assert int(count) == os.cpu_count()
    assert name
    assert name != platform.machine()


@NO_NVML
def test_without_nvml_the_builds_first_gpu_names_the_hardware() -> None:
    cpu_only = Device(name="BLAS0", backend=None, description="OpenBLAS", total_mib=0,
                      free_mib=0)
    second = Device(name="Vulkan1", backend=Backend.VULKAN, description="llvmpipe",
                    total_mib=1024, free_mib=1024)
    hardware = detect_hardware([cpu_only, RADEON, second])
    assert hardware.gpu == RADEON.description
    assert hardware.vram_mib == RADEON.total_mib
    assert hardware.gpu_driver is None
    assert hardware.host == socket.gethostname()
    assert hardware.cpu == cpu_model()
    assert hardware.describe().startswith(f"{RADEON.description} (24560 MiB) on ")


@NO_NVML
def test_without_nvml_or_gpu_devices_there_is_no_gpu() -> None:
    cpu_only = Device(name="SYCL0", backend=None, description="Intel iGPU", total_mib=8000,
                      free_mib=8000)
    for devices in ([], [cpu_only]):
        hardware = detect_hardware(devices)
        assert (hardware.gpu, hardware.vram_mib) == ("none", None)
        assert hardware.describe().startswith("no GPU on ")


def test_an_nvidia_gpu_the_runner_probe_lists_names_the_hardware(
        monkeypatch: pytest.MonkeyPatch) -> None:
    h200 = gpu_tool_readers.SeenGpu(name="NVIDIA H200", source=gpu_tool_readers.NVML,
                                    driver="570.86", total_mib=143771, free_mib=143000)
    listed = gpu_tool_readers.GpuHealth(Backend.CUDA, gpu_tool_readers.NVML, gpus=(h200,))
    monkeypatch.setattr(hardware, "runner_gpu_health", lambda backend: listed)
    found = detect_hardware((RADEON,))
    assert (found.gpu, found.gpu_driver, found.vram_mib) == ("NVIDIA H200", "570.86", 143771)
