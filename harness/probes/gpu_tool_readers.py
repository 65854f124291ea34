"""What each vendor's GPU tool says about this runner's GPUs, read into ``GpuHealth`` (pure).

NVML (``pynvml``) for CUDA; AMD SMI for ROCm (the ``amdsmi`` Python module's calls, or
the text of ``rocm-smi --json``); ``vulkaninfo --summary`` for Vulkan. Each reader is a
function over a tool's text or the values its calls return (the module or a stand-in),
tested on recorded samples (``tests/data/gpu_tools/``); ``harness.probes.gpu_health``
runs the tools and hands their answers here.

A runner is healthy for a backend when the tool answers and lists at least one real
GPU. A Vulkan CPU device (llvmpipe, lavapipe, SwiftShader) is a *software* device: it is
reported, but it is not a GPU a GPU run may count on unless the caller allows it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import pynvml

from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo

NVML = "nvml"
AMDSMI = "amdsmi"
ROCM_SMI = "rocm-smi"
VULKANINFO = "vulkaninfo"

ROCM_SMI_ARGV = ("rocm-smi", "--showproductname", "--showmeminfo", "vram",
                 "--showdriverversion", "--json")
VULKANINFO_ARGV = ("vulkaninfo", "--summary")

_MIB = 1024 * 1024
_TAIL_CHARS = 400

NVIDIA_DRIVER_FIX = (
    "install the NVIDIA driver (Debian: enable the non-free component and "
    "`apt-get install nvidia-driver`, which brings libnvidia-ml.so.1), reboot, and check "
    "with `nvidia-smi`; in a container, start it with the NVIDIA runtime (`--gpus all`)")
AMDGPU_FIX = ("load the amdgpu kernel driver (`modprobe amdgpu`; Debian: a kernel with "
              "amdgpu and `apt-get install firmware-amd-graphics`), then check that "
              "/dev/kfd exists")
VULKAN_DRIVER_FIX = ("install the GPU's Vulkan driver: `apt-get install mesa-vulkan-drivers` "
                     "for AMD and Intel GPUs, the NVIDIA driver for NVIDIA GPUs (in a "
                     "container, NVIDIA_DRIVER_CAPABILITIES must include graphics)")


@dataclass(frozen=True)
class SeenGpu:
    """One device as a vendor tool reports it; fields the tool does not give are None."""

    name: str
    source: str
    driver: str | None = None
    total_mib: int | None = None
    free_mib: int | None = None
    #: Vulkan only: ``discrete gpu``, ``integrated gpu``, ``virtual gpu``, ``cpu``, ``other``.
    device_type: str | None = None
    api_version: str | None = None
    #: A CPU implementation (Vulkan deviceType CPU): it runs, but on no GPU.
    software: bool = False

    def gpu_info(self, backend: Backend) -> GpuInfo | None:
        """What autotune reads; None when the tool gives no VRAM size to bucket by."""
        if self.total_mib is None:
            return None
        return GpuInfo(name=self.name, vram_mib=self.total_mib, backend=backend,
                       driver=self.driver)

    def describe(self) -> str:
        parts = [f"driver {self.driver}" if self.driver else "driver unknown"]
        if self.total_mib is not None:
            parts.append(f"{self.total_mib} MiB")
        if self.free_mib is not None:
            parts.append(f"{self.free_mib} MiB free")
        if self.device_type:
            parts.append(self.device_type)
        if self.api_version:
            parts.append(f"Vulkan {self.api_version}")
        return f"{self.name} ({', '.join(parts)}) via {self.source}"


@dataclass(frozen=True)
class GpuHealth:
    """What one backend can use on this runner: its GPUs, or the reason it has none."""

    backend: Backend
    #: The tool that answered, or the one that was looked for.
    source: str
    gpus: tuple[SeenGpu, ...] = ()
    #: Software devices that were left out (Vulkan llvmpipe and the like).
    software: tuple[SeenGpu, ...] = ()
    #: Why no GPU is usable (None when one is), and what to do about it.
    problem: str | None = None
    fix: str | None = None

    @property
    def usable(self) -> bool:
        return self.problem is None and bool(self.gpus)

    @property
    def reason(self) -> str | None:
        """The problem and its fix in one sentence; None when a GPU is usable."""
        if self.problem is None:
            return None if self.gpus else f"no {self.backend.value} GPU was listed"
        return f"{self.problem}; {self.fix}" if self.fix else self.problem


# --- NVML (CUDA) ----------------------------------------------------------------------


def nvml_gpus(nvml: Any) -> tuple[SeenGpu, ...]:
    """The GPUs an initialised NVML lists; ``nvml`` is the pynvml module or a stand-in."""
    driver = _text(nvml.nvmlSystemGetDriverVersion())
    gpus = []
    for index in range(int(nvml.nvmlDeviceGetCount())):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        memory = nvml.nvmlDeviceGetMemoryInfo(handle)
        gpus.append(SeenGpu(name=_text(nvml.nvmlDeviceGetName(handle)), source=NVML,
                            driver=driver, total_mib=int(memory.total) // _MIB,
                            free_mib=int(memory.free) // _MIB))
    return tuple(gpus)


def nvml_failure(code: int | None, message: str) -> GpuHealth:
    """Why NVML did not answer, from its error code, and the fix."""
    said = f"NVML: {message}" if message else "NVML failed"
    if code == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
        return unusable(Backend.CUDA, NVML,
                        f"no NVIDIA driver on this runner ({said}: libnvidia-ml.so.1 cannot "
                        "be loaded)", NVIDIA_DRIVER_FIX)
    if code == pynvml.NVML_ERROR_DRIVER_NOT_LOADED:
        return unusable(Backend.CUDA, NVML,
                        f"the NVIDIA kernel driver is not loaded ({said})",
                        "load it with `modprobe nvidia` (or reboot after installing "
                        "nvidia-driver) and check `dmesg | grep -i nvidia`")
    if code == pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH:
        return unusable(Backend.CUDA, NVML,
                        f"the NVIDIA driver library and kernel module are different "
                        f"versions ({said}), as after a driver update without a reboot",
                        "reboot the runner")
    if code == pynvml.NVML_ERROR_NO_PERMISSION:
        return unusable(Backend.CUDA, NVML, f"NVML may not open the GPU ({said})",
                        "run as a user who may open /dev/nvidia* (e.g. "
                        "`usermod -aG video $USER`, then log in again)")
    return unusable(Backend.CUDA, NVML, f"NVML did not answer ({said})",
                    "check the driver with `nvidia-smi` on this runner")


def nvml_health(gpus: tuple[SeenGpu, ...], driver: str | None) -> GpuHealth:
    if not gpus:
        return unusable(Backend.CUDA, NVML,
                        f"NVML answers (driver {driver or 'unknown'}) but lists no NVIDIA GPU",
                        "check `nvidia-smi -L` and `lspci | grep -i nvidia`, and in a "
                        "container pass the GPUs (`--gpus all`)")
    return GpuHealth(Backend.CUDA, NVML, gpus=gpus)

def nvml_answer(nvml: Any) -> GpuHealth:
    """What an initialised NVML says: the GPUs it lists, or that it lists none."""
    return nvml_health(nvml_gpus(nvml), _text(nvml.nvmlSystemGetDriverVersion()))



# --- AMD SMI (ROCm) -------------------------------------------------------------------


def gpu_from_amdsmi(asic: Mapping[str, Any], vram: Mapping[str, Any] | None,
                    total_bytes: int | None, driver: Mapping[str, Any] | None) -> SeenGpu:
    """One GPU from the dicts ``amdsmi_get_gpu_asic_info``, ``..._vram_usage`` (MB) and
    ``..._driver_info`` return; ``total_bytes`` is ``amdsmi_get_gpu_memory_total``'s
    answer, used when the VRAM usage call gave nothing."""
    name = _known(asic.get("market_name")) or f"AMD GPU {asic.get('device_id', '?')}"
    total = free = None
    if vram is not None and _number(vram.get("vram_total")) is not None:
        total = int(_number(vram["vram_total"]) or 0)
        used = _number(vram.get("vram_used"))
        free = total - int(used) if used is not None else None
    elif total_bytes is not None:
        total = int(total_bytes) // _MIB
    version = _known(driver.get("driver_version")) if driver is not None else None
    return SeenGpu(name=name, source=AMDSMI, driver=version, total_mib=total, free_mib=free)


def amdsmi_gpus(amdsmi: Any) -> tuple[SeenGpu, ...]:
    """The GPUs an initialised AMD SMI lists; ``amdsmi`` is the module or a stand-in.

    VRAM and driver are best effort (a partitioned or virtual GPU may refuse them); the
    name is not, so a GPU that cannot even say that is an error to report.
    """
    gpus = []
    for handle in amdsmi.amdsmi_get_processor_handles():
        asic = amdsmi.amdsmi_get_gpu_asic_info(handle)
        vram = _attempt(amdsmi.amdsmi_get_gpu_vram_usage, handle)
        total = None
        if vram is None and hasattr(amdsmi, "AmdSmiMemoryType"):
            total = _attempt(amdsmi.amdsmi_get_gpu_memory_total, handle,
                             amdsmi.AmdSmiMemoryType.VRAM)
        driver = _attempt(amdsmi.amdsmi_get_gpu_driver_info, handle)
        gpus.append(gpu_from_amdsmi(asic, vram, total, driver))
    return tuple(gpus)


def amdsmi_failure(message: str) -> GpuHealth:
    return unusable(Backend.ROCM, AMDSMI,
                    f"AMD SMI could not start ({message}): the amdgpu driver is not in use",
                    AMDGPU_FIX)


def parse_rocm_smi_json(text: str) -> tuple[SeenGpu, ...]:
    """The ``card<N>`` entries of ``rocm-smi ... --json``; ValueError when it is no JSON.

    Key spelling varies by release ("Card series" in 5.x, "Card Series" in 6.x), so keys
    are compared without case. The driver version sits in the card or, as printed by
    ``--showdriverversion``, under ``system``.
    """
    data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("rocm-smi printed JSON that is not an object")
    system = _lower_keys(data.get("system"))
    cards = sorted((k for k in data if re.fullmatch(r"card\d+", k)), key=lambda k: int(k[4:]))
    gpus = []
    for key in cards:
        card = _lower_keys(data[key])
        name = next((value for field in ("card series", "card model", "card sku")
                     if (value := _known(card.get(field))) and not _HEX_ID.match(value)),
                    key)
        total = _number(card.get("vram total memory (b)"))
        used = _number(card.get("vram total used memory (b)"))
        total_mib = int(total) // _MIB if total is not None else None
        free_mib = (int(total - used) // _MIB
                    if total is not None and used is not None else None)
        driver = _known(card.get("driver version")) or _known(system.get("driver version"))
        gpus.append(SeenGpu(name=name, source=ROCM_SMI, driver=driver, total_mib=total_mib,
                            free_mib=free_mib))
    return tuple(gpus)


def rocm_smi_health(stdout: str, stderr: str, returncode: int) -> GpuHealth:
    """What a ``rocm-smi --json`` run says. It exits 0 even when it has nothing to say
    (no amdgpu: an empty stdout and the reason on stderr), so the text decides."""
    said = (stderr + "\n" + stdout).strip()
    rerun = f"run `{' '.join(ROCM_SMI_ARGV)}` on this runner and fix what it reports"
    if "amdgpu not found in modules" in said or "Driver not initialized" in said:
        return unusable(Backend.ROCM, ROCM_SMI,
                        f"the amdgpu kernel driver is not loaded (rocm-smi: "
                        f"{_last_line(said)})", AMDGPU_FIX)
    if not stdout.strip():
        return unusable(Backend.ROCM, ROCM_SMI,
                        f"rocm-smi printed nothing (exit {returncode}: "
                        f"{_tail(said) or 'no message'})", rerun)
    try:
        gpus = parse_rocm_smi_json(stdout)
    except ValueError:
        return unusable(Backend.ROCM, ROCM_SMI,
                        f"rocm-smi --json printed no JSON (exit {returncode}: {_tail(said)})",
                        rerun)
    return amd_health(gpus, ROCM_SMI)


def amd_health(gpus: tuple[SeenGpu, ...], source: str) -> GpuHealth:
    if not gpus:
        return unusable(Backend.ROCM, source, f"{source} answers but lists no AMD GPU",
                        "check `lspci | grep -i amd` and that /dev/kfd and /dev/dri exist "
                        "(in a container, pass them with --device)")
    return GpuHealth(Backend.ROCM, source, gpus=gpus)


# --- vulkaninfo (Vulkan) --------------------------------------------------------------

_GPU_HEADER = re.compile(r"^\s*GPU(\d+):\s*$")
_FIELD = re.compile(r"^\s*(\w+)\s*=\s*(.*?)\s*$")
_HEX_ID = re.compile(r"^0x[0-9a-fA-F]+$")
_NO_DRIVER_SIGNS = ("Found no drivers", "ERROR_INCOMPATIBLE_DRIVER",
                    "ERROR_INITIALIZATION_FAILED")


def parse_vulkan_summary(text: str) -> tuple[SeenGpu, ...]:
    """The ``GPU<N>:`` blocks of ``vulkaninfo --summary``, in order.

    Old summaries (vulkaninfo 1.2) have no driverName/driverInfo; the driver is then
    the ``driverVersion`` line. Vulkan reports no memory size here: VRAM stays None.
    """
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        if _GPU_HEADER.match(line):
            blocks.append({})
            continue
        field = _FIELD.match(line)
        if blocks and field and field[1] not in blocks[-1]:
            blocks[-1][field[1]] = field[2]
    return tuple(_vulkan_device(block) for block in blocks if block.get("deviceName"))


def _vulkan_device(block: Mapping[str, str]) -> SeenGpu:
    raw_type = block.get("deviceType", "")
    device_type = (raw_type.removeprefix("PHYSICAL_DEVICE_TYPE_").lower().replace("_", " ")
                   or None)
    driver = " ".join(part for part in (block.get("driverName"), block.get("driverInfo"))
                      if part) or block.get("driverVersion")
    return SeenGpu(name=block["deviceName"], source=VULKANINFO, driver=driver or None,
                   device_type=device_type, api_version=block.get("apiVersion"),
                   software=raw_type == "PHYSICAL_DEVICE_TYPE_CPU")


def vulkan_health(stdout: str, stderr: str, returncode: int, *,
                  allow_software: bool = False) -> GpuHealth:
    """What a ``vulkaninfo --summary`` run says about Vulkan GPUs on this runner."""
    said = (stderr + "\n" + stdout).strip()
    devices = parse_vulkan_summary(stdout)
    if not devices and any(sign in said for sign in _NO_DRIVER_SIGNS):
        return unusable(Backend.VULKAN, VULKANINFO,
                        f"no Vulkan driver (ICD) is installed or it cannot start "
                        f"(vulkaninfo: {_sign_line(said)})", VULKAN_DRIVER_FIX)
    if not devices:
        return unusable(Backend.VULKAN, VULKANINFO,
                        f"vulkaninfo --summary lists no Vulkan device (exit {returncode}: "
                        f"{_tail(said) or 'no message'})", VULKAN_DRIVER_FIX)
    hardware = tuple(d for d in devices if not d.software)
    software = tuple(d for d in devices if d.software)
    if allow_software:
        return GpuHealth(Backend.VULKAN, VULKANINFO, gpus=hardware + software)
    if not hardware:
        names = ", ".join(d.name for d in software)
        return GpuHealth(Backend.VULKAN, VULKANINFO, software=software,
                         problem=f"only a software Vulkan device ({names}): Vulkan runs on "
                                 "the CPU because no GPU driver is in use",
                         fix=f"{VULKAN_DRIVER_FIX}, and check that /dev/dri exists")
    return GpuHealth(Backend.VULKAN, VULKANINFO, gpus=hardware, software=software)


# --- small pure helpers ---------------------------------------------------------------


def unusable(backend: Backend, source: str, problem: str, fix: str) -> GpuHealth:
    """The health of a backend with no usable GPU: what is wrong, and what to do."""
    return GpuHealth(backend, source, problem=problem, fix=fix)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _known(value: object) -> str | None:
    """A tool's string value, or None for its ways of saying "unknown"."""
    if value is None:
        return None
    text = _text(value).strip()
    return None if text in ("", "N/A", "n/a", "unknown", "Unknown") else text


def _number(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(_text(value).strip())
    except (TypeError, ValueError):
        return None


def _lower_keys(value: object) -> dict[str, Any]:
    return {str(k).strip().lower(): v for k, v in value.items()} if isinstance(value, dict) \
        else {}


def _attempt(call: Callable[..., Any], *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:  # a vendor library's own exception types; the value is optional
        return None


def _tail(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _TAIL_CHARS else "..." + text[-_TAIL_CHARS:]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _sign_line(text: str) -> str:
    """The first line naming the failure, else the last line."""
    for line in text.splitlines():
        if any(sign in line for sign in _NO_DRIVER_SIGNS):
            return line.strip()
    return _last_line(text)
