"""Runner GPU health: the vendor tools' outputs (recorded samples), this machine, the plugin.

The samples in tests/data/gpu_tools/ are what NVML, AMD SMI, rocm-smi and vulkaninfo
print on machines that have GPUs (README.md there says where each comes from); this
machine has none of those tools, so it is the "nothing usable" case.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import gpu_helpers
import pynvml
import pytest

from harness.facts.build import Backend, BuildInfo, Capabilities
from harness.facts.gpu import STOCK_CACHE_TYPES, GpuInfo
from harness.files import write_json_atomic
from harness.probes.gpu_health import probe_amd, probe_gpus, probe_nvml, probe_vulkan
from harness.probes.gpu_tool_readers import (
    AMDSMI,
    NVML,
    ROCM_SMI,
    VULKANINFO,
    SeenGpu,
    amdsmi_gpus,
    gpu_from_amdsmi,
    nvml_failure,
    nvml_gpus,
    parse_rocm_smi_json,
    parse_vulkan_summary,
    rocm_smi_health,
    vulkan_health,
)

pytest_plugins = ["pytester"]

SAMPLES = Path(__file__).parent / "data" / "gpu_tools"
MIB = 1024 * 1024


def _sample(name: str) -> str:
    return (SAMPLES / name).read_text()




NO_NVML = pytest.mark.skipif(gpu_helpers.nvml_answers(), reason="NVML answers on this machine")


# --- vulkaninfo --summary -------------------------------------------------------------


def test_vulkan_summary_lists_every_device_with_type_driver_and_api() -> None:
    intel, nvidia, llvmpipe = parse_vulkan_summary(
        _sample("vulkaninfo-summary-intel-nvidia-llvmpipe.txt"))
    assert (intel.name, intel.device_type, intel.software) == (
        "Intel(R) Graphics (RPL-S)", "integrated gpu", False)
    assert intel.driver == "Intel open-source Mesa driver Mesa 25.2.8-0ubuntu0.24.04.2"
    assert (nvidia.name, nvidia.device_type, nvidia.driver, nvidia.api_version) == (
        "NVIDIA GeForce RTX 4070 Laptop GPU", "discrete gpu", "NVIDIA 595.84", "1.4.329")
    assert (llvmpipe.device_type, llvmpipe.software) == ("cpu", True)
    # vulkaninfo --summary gives no memory size: autotune gets no GpuInfo from it.
    assert nvidia.total_mib is None
    assert nvidia.gpu_info(Backend.VULKAN) is None


def test_a_vulkan_machine_with_a_gpu_is_usable_and_llvmpipe_is_left_aside() -> None:
    health = vulkan_health(_sample("vulkaninfo-summary-radv-llvmpipe.txt"), "", 0)
    assert health.usable
    assert [g.name for g in health.gpus] == ["AMD Radeon RX 7900 XTX (RADV NAVI31)"]
    assert health.gpus[0].driver == "radv Mesa 25.0.2-arch1.1"
    assert [g.name for g in health.software] == ["llvmpipe (LLVM 19.1.7, 256 bits)"]
    assert health.reason is None


def test_only_llvmpipe_is_not_a_usable_gpu_and_says_which_driver_to_install() -> None:
    health = vulkan_health(_sample("vulkaninfo-summary-llvmpipe-only.txt"), "", 0)
    assert not health.usable
    assert health.reason is not None
    assert "only a software Vulkan device (llvmpipe (LLVM 20.1.2, 256 bits))" in health.reason
    assert "apt-get install mesa-vulkan-drivers" in health.reason


def test_llvmpipe_counts_when_software_devices_are_allowed() -> None:
    health = vulkan_health(_sample("vulkaninfo-summary-llvmpipe-only.txt"), "", 0,
                           allow_software=True)
    assert health.usable
    assert [g.software for g in health.gpus] == [True]


def test_vulkaninfo_without_a_driver_names_the_missing_icd() -> None:
    health = vulkan_health("", _sample("vulkaninfo-no-drivers.txt"), 1)
    assert not health.usable
    assert health.problem is not None
    assert "no Vulkan driver (ICD)" in health.problem
    assert "Found no drivers!" in health.problem
    assert health.fix is not None
    assert "mesa-vulkan-drivers" in health.fix


def test_vulkaninfo_that_fails_silently_reports_its_exit_code() -> None:
    health = vulkan_health("", "", 139)
    assert health.reason is not None
    assert "exit 139" in health.reason


# --- rocm-smi --json ------------------------------------------------------------------


def test_rocm_smi_5_style_keys_give_names_vram_and_the_system_driver() -> None:
    rx6700, cezanne = parse_rocm_smi_json(_sample("rocm-smi-rx6700-cezanne.json"))
    assert rx6700.name == "Navi 22 [Radeon RX 6700/6700 XT/6750 XT / 6800M/6850M XT]"
    assert (rx6700.total_mib, rx6700.free_mib) == (10720641024 // MIB,
                                                   (10720641024 - 16400384) // MIB)
    assert rx6700.driver == cezanne.driver == "6.12.12"
    assert cezanne.total_mib == 512
    assert rx6700.source == ROCM_SMI


def test_rocm_smi_6_style_capitalised_keys_are_read_too() -> None:
    (apu,) = parse_rocm_smi_json(_sample("rocm-smi-6.2-rembrandt.json"))
    assert apu.name == "Rembrandt [Radeon 680M]"
    assert (apu.total_mib, apu.free_mib) == (512, (536870912 - 445550592) // MIB)
    assert apu.driver is None  # this call had no --showdriverversion


def test_rocm_smi_lists_cards_in_index_order() -> None:
    gpus = parse_rocm_smi_json(_sample("rocm-smi-4x-mi210.json"))
    assert [g.name for g in gpus] == ["Instinct MI210"] * 4
    assert gpus[0].gpu_info(Backend.ROCM) == GpuInfo(
        name="Instinct MI210", vram_mib=65520, backend=Backend.ROCM, driver=None)


def test_rocm_smi_without_amdgpu_exits_0_with_empty_stdout_and_is_caught() -> None:
    health = rocm_smi_health("", _sample("rocm-smi-no-amdgpu.stderr.txt"), 0)
    assert not health.usable
    assert health.reason is not None
    assert health.reason.startswith("the amdgpu kernel driver is not loaded")
    assert "modprobe amdgpu" in health.reason


def test_rocm_smi_output_that_is_not_json_is_reported_not_parsed() -> None:
    health = rocm_smi_health("WARNING: unsupported\n", "", 2)
    assert health.reason is not None
    assert "printed no JSON (exit 2" in health.reason


def test_rocm_smi_with_no_card_says_so() -> None:
    health = rocm_smi_health('{"system": {"Driver version": "6.8.5"}}', "", 0)
    assert health.reason is not None
    assert "lists no AMD GPU" in health.reason


# --- AMD SMI Python API ---------------------------------------------------------------


def _fake_amdsmi(devices: list[dict[str, Any]], *, init_error: str | None = None,
                 no_vram_usage: bool = False) -> SimpleNamespace:
    """A module-shaped stand-in answering what the recorded calls returned."""

    def init() -> None:
        if init_error is not None:
            raise RuntimeError(init_error)

    def vram_usage(handle: dict[str, Any]) -> dict[str, Any]:
        if no_vram_usage:
            raise RuntimeError("AMDSMI_STATUS_NOT_SUPPORTED")
        return dict(handle["vram_usage"])

    return SimpleNamespace(
        amdsmi_init=init, amdsmi_shut_down=lambda: None,
        amdsmi_get_processor_handles=lambda: list(devices),
        amdsmi_get_gpu_asic_info=lambda h: dict(h["asic_info"]),
        amdsmi_get_gpu_vram_usage=vram_usage,
        amdsmi_get_gpu_driver_info=lambda h: dict(h["driver_info"]),
        AmdSmiMemoryType=SimpleNamespace(VRAM=0),
        amdsmi_get_gpu_memory_total=lambda h, _kind: h["vram_usage"]["vram_total"] * MIB)


def _amdsmi_devices() -> list[dict[str, Any]]:
    devices: list[dict[str, Any]] = json.loads(_sample("amdsmi-2x-mi300x.json"))["devices"]
    return devices


def test_amdsmi_calls_give_name_vram_in_mb_and_driver() -> None:
    first, second = amdsmi_gpus(_fake_amdsmi(_amdsmi_devices()))
    assert (first.name, first.total_mib, first.free_mib, first.driver) == (
        "AMD Instinct MI300X", 196592, 196592 - 283, "6.8.5")
    assert second.free_mib == 196592 - 191071
    assert first.source == AMDSMI


def test_amdsmi_without_vram_usage_falls_back_on_memory_total_in_bytes() -> None:
    (gpu, _) = amdsmi_gpus(_fake_amdsmi(_amdsmi_devices(), no_vram_usage=True))
    assert (gpu.total_mib, gpu.free_mib) == (196592, None)


def test_amdsmi_market_name_na_falls_back_on_the_device_id() -> None:
    gpu = gpu_from_amdsmi({"market_name": "N/A", "device_id": 29857}, None, None, None)
    assert gpu.name == "AMD GPU 29857"
    assert (gpu.total_mib, gpu.driver) == (None, None)


def test_probe_amd_uses_the_amdsmi_module_when_it_imports(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", _fake_amdsmi(_amdsmi_devices()))
    health = probe_amd()
    assert health.usable
    assert health.source == AMDSMI
    assert len(health.gpus) == 2


def test_probe_amd_reports_an_amdsmi_that_cannot_start(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", _fake_amdsmi(
        [], init_error="an error occurred: AMDSMI_STATUS_DRIVER_NOT_LOADED"))
    health = probe_amd()
    assert not health.usable
    assert health.reason is not None
    assert "AMDSMI_STATUS_DRIVER_NOT_LOADED" in health.reason
    assert "modprobe amdgpu" in health.reason


# --- NVML -----------------------------------------------------------------------------


def _fake_nvml(sample: dict[str, Any]) -> SimpleNamespace:
    devices = sample["devices"]
    return SimpleNamespace(
        nvmlInit=lambda: None, nvmlShutdown=lambda: None,
        nvmlSystemGetDriverVersion=lambda: sample["driver_version"],
        nvmlDeviceGetCount=lambda: len(devices),
        nvmlDeviceGetHandleByIndex=lambda i: devices[i],
        nvmlDeviceGetName=lambda h: h["name"],
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(**h["memory"]))


def test_nvml_gives_name_driver_and_vram_in_mib() -> None:
    (gpu,) = nvml_gpus(_fake_nvml(json.loads(_sample("nvml-rtx4090.json"))))
    assert gpu == SeenGpu(name="NVIDIA GeForce RTX 4090", source=NVML, driver="550.54.15",
                          total_mib=24564, free_mib=25090842624 // MIB)
    assert gpu.gpu_info(Backend.CUDA) == GpuInfo(
        name="NVIDIA GeForce RTX 4090", vram_mib=24564, backend=Backend.CUDA,
        driver="550.54.15")


def test_probe_nvml_on_an_l4_is_usable() -> None:
    health = probe_nvml(_fake_nvml(json.loads(_sample("nvml-l4.json"))))
    assert health.usable
    assert [(g.name, g.total_mib, g.free_mib) for g in health.gpus] == [
        ("NVIDIA L4", 23034, 22566)]


def test_nvml_with_no_device_is_not_usable() -> None:
    health = probe_nvml(_fake_nvml({"driver_version": "550.54.15", "devices": []}))
    assert health.reason is not None
    assert "NVML answers (driver 550.54.15) but lists no NVIDIA GPU" in health.reason


@pytest.mark.parametrize(("code", "words"), [
    (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "apt-get install nvidia-driver"),
    (pynvml.NVML_ERROR_DRIVER_NOT_LOADED, "modprobe nvidia"),
    (pynvml.NVML_ERROR_LIB_RM_VERSION_MISMATCH, "reboot the runner"),
    (pynvml.NVML_ERROR_NO_PERMISSION, "usermod -aG video"),
    (pynvml.NVML_ERROR_UNKNOWN, "nvidia-smi"),
])
def test_each_nvml_failure_has_its_own_fix(code: int, words: str) -> None:
    message = str(pynvml.NVMLError(code))
    health = nvml_failure(code, message)
    assert health.reason is not None
    assert message in health.reason
    assert words in health.reason


def test_an_nvml_init_failure_becomes_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _fake_nvml({"driver_version": "", "devices": []})

    def init() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)

    fake.nvmlInit = init
    health = probe_nvml(fake)
    assert health.reason is not None
    assert health.reason.startswith("the NVIDIA kernel driver is not loaded (NVML: Driver "
                                    "Not Loaded)")


# --- the thin probes, on this machine and with a stand-in tool on PATH ------------------


@NO_NVML
def test_this_machine_has_no_usable_cuda_gpu_because_no_driver() -> None:
    health = probe_gpus(Backend.CUDA)
    assert not health.usable
    assert health.reason is not None
    assert "NVIDIA" in health.reason
    assert "apt-get install nvidia-driver" in health.reason or "modprobe nvidia" in \
        health.reason


@pytest.mark.skipif(bool(shutil.which("rocm-smi") or importlib.util.find_spec("amdsmi")),
                    reason="an AMD SMI is installed here")
def test_this_machine_has_no_usable_rocm_gpu_because_no_amd_smi() -> None:
    health = probe_gpus(Backend.ROCM)
    assert not health.usable
    assert health.reason is not None
    assert "neither the amdsmi Python module nor rocm-smi is installed" in health.reason
    assert "apt-get install rocm-smi" in health.reason


@pytest.mark.skipif(shutil.which("vulkaninfo") is not None, reason="vulkaninfo is here")
def test_this_machine_has_no_usable_vulkan_gpu_because_no_vulkaninfo() -> None:
    health = probe_gpus(Backend.VULKAN)
    assert not health.usable
    assert health.reason is not None
    assert "apt-get install vulkan-tools" in health.reason


def test_probe_gpus_refuses_the_cpu_backend() -> None:
    with pytest.raises(ValueError, match="cpu is not a GPU backend"):
        probe_gpus(Backend.CPU)


def _fake_tool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str,
               stdout_file: str | None, stderr_file: str | None, code: int) -> None:
    """A ``name`` on PATH that prints recorded output, as the real tool would."""
    tool = tmp_path / "bin" / name
    tool.parent.mkdir(exist_ok=True)
    lines = ["#!/bin/sh"]
    if stdout_file:
        lines.append(f"cat '{SAMPLES / stdout_file}'")
    if stderr_file:
        lines.append(f"cat '{SAMPLES / stderr_file}' >&2")
    lines.append(f"exit {code}")
    tool.write_text("\n".join(lines) + "\n")
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:/usr/bin:/bin")


def test_probe_vulkan_runs_vulkaninfo_from_path(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tool(tmp_path, monkeypatch, "vulkaninfo",
               "vulkaninfo-summary-intel-nvidia-llvmpipe.txt", None, 0)
    health = probe_vulkan()
    assert health.usable
    assert health.source == VULKANINFO
    assert [g.name for g in health.gpus] == ["Intel(R) Graphics (RPL-S)",
                                             "NVIDIA GeForce RTX 4070 Laptop GPU"]


def test_probe_amd_falls_back_on_rocm_smi_and_reads_its_stderr(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)  # as if not installed
    _fake_tool(tmp_path, monkeypatch, "rocm-smi", None, "rocm-smi-no-amdgpu.stderr.txt", 0)
    health = probe_amd()
    assert health.source == ROCM_SMI
    assert health.reason is not None
    assert "amdgpu kernel driver is not loaded" in health.reason


def test_probe_amd_reads_rocm_smi_json(tmp_path: Path,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "amdsmi", None)
    _fake_tool(tmp_path, monkeypatch, "rocm-smi", "rocm-smi-4x-mi210.json", None, 0)
    health = probe_amd()
    assert health.usable
    assert len(health.gpus) == 4


# --- the plugin: --harness-require-gpu and HARNESS_REQUIRE_GPU --------------------------

TRIVIAL = "def test_trivial():\n    assert True\n"
GPU_MARKED = """
import pytest

@pytest.mark.gpu("cuda")
def test_needs_cuda():
    assert False, "must not run without a usable CUDA GPU"
"""


def _fake_server(tmp_path: Path, devices: str) -> Path:
    """A stand-in llama-server whose --list-devices prints ``devices``."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir(parents=True, exist_ok=True)
    binary.write_text("#!/bin/sh\nprintf 'Available devices:\\n%s\\n' " f"'{devices}'\n")
    binary.chmod(0o755)
    return binary


def _cuda_build(tmp_path: Path) -> Path:
    """A CUDA build record whose binary lists an RTX 4090, as a CUDA build on a GPU would."""
    binary = _fake_server(tmp_path, "  CUDA0: NVIDIA GeForce RTX 4090 (24564 MiB, 24000 MiB free)")
    info = BuildInfo(key="cuda-test", backend=Backend.CUDA, binary=str(binary),
                     version="version: test", source_digest="0" * 64, source_origin="test",
                     cmake_flags=("-DGGML_CUDA=ON",), compiler="gcc", build_seconds=1.0,
                     capabilities=Capabilities(cache_types_k=STOCK_CACHE_TYPES,
                                               cache_types_v=STOCK_CACHE_TYPES))
    record = tmp_path / "build.json"
    write_json_atomic(record, info.to_json())
    return record


@NO_NVML
def test_require_cuda_on_this_runner_fails_at_session_start_with_the_driver_fix(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(TRIVIAL)
    server = _fake_server(tmp_path, "  (none)")
    result = pytester.runpytest_subprocess(f"--harness-server-bin={server}",
                                           "--harness-require-gpu=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "--harness-require-gpu=cuda: the build under test" in output
    assert "this runner has no usable cuda GPU: no NVIDIA driver on this runner" in output
    assert "apt-get install nvidia-driver" in output
    assert "passed" not in output


@NO_NVML
def test_a_right_build_on_a_runner_without_the_driver_still_fails(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    # The build is CUDA and lists a CUDA device, so only the runner check can catch it.
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess(f"--harness-build={_cuda_build(tmp_path)}",
                                           "--harness-require-gpu=cuda")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "--harness-require-gpu=cuda: this runner has no usable cuda GPU" in output
    assert "is a cpu build" not in output


@NO_NVML
def test_a_gpu_test_skips_naming_the_runner_problem_when_not_required(
        pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makepyfile(GPU_MARKED)
    result = pytester.runpytest_subprocess("-rs", f"--harness-build={_cuda_build(tmp_path)}")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*needs a cuda build and device*no NVIDIA driver*"])


def test_an_unknown_harness_require_gpu_variable_lists_the_allowed_values(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_REQUIRE_GPU", "bogus")
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "HARNESS_REQUIRE_GPU='bogus': 'bogus' is not one of cuda, rocm, vulkan" in output
    assert "INTERNALERROR" not in output
    assert "passed" not in output


def test_an_unknown_require_gpu_option_is_refused_by_argparse(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess("--harness-require-gpu=bogus")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(
        ["*--harness-require-gpu: 'bogus' is not one of cuda, rocm, vulkan (BACKEND or*"])


@pytest.mark.parametrize("bad", ["cuda:0", "cuda:x", "cuda:"])
def test_a_bad_device_count_is_refused(pytester: pytest.Pytester, bad: str) -> None:
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess(f"--harness-require-gpu={bad}")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*the device count after ':' must be a whole number*"])


@NO_NVML
def test_a_device_count_names_how_many_the_build_lists(pytester: pytest.Pytester,
                                                       tmp_path: Path) -> None:
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess(f"--harness-build={_cuda_build(tmp_path)}",
                                           "--harness-require-gpu=cuda:2")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "--harness-require-gpu=cuda:2: " in output
    assert "--list-devices shows 1 cuda device; this run needs 2" in output
