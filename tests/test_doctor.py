"""``harness doctor``: rows and verdict from synthetic machines, then the real command here."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from types import MappingProxyType

import gpu_helpers
import pynvml
import pytest
from click.testing import CliRunner

from harness.commands.doctor import doctor_command
from harness.doctor import gather
from harness.doctor.checks import (
    GPU_COMPILERS,
    Row,
    Status,
    config_row,
    doctor_rows,
    exit_code,
    verdict,
)
from harness.doctor.facts import (
    AllureFacts,
    CachedBuild,
    CacheFacts,
    DeviceFacts,
    DockerFacts,
    DoctorFacts,
    Package,
    ServiceFacts,
    StoreFacts,
    Tool,
)
from harness.errors import ToolMissingError
from harness.facts.build import Backend
from harness.facts.cuda_toolkit import (
    Cublas,
    CublasOrigin,
    CudaToolkit,
    DriverLibrary,
    DriverLibraryOrigin,
)
from harness.probes import toolchain
from harness.probes.gpu_configs import load_gpu_configs
from harness.probes.gpu_tool_readers import GpuHealth, SeenGpu, nvml_failure
from harness.resources.python_pins import read_constraints

CONFIGS = load_gpu_configs()
NO_NVIDIA = nvml_failure(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, "NVML Shared Library Not Found")
NO_AMD = GpuHealth(Backend.ROCM, "rocm-smi", problem="neither the amdsmi Python module nor "
                   "rocm-smi is installed", fix="`apt-get install rocm-smi`")
NO_VULKAN = GpuHealth(Backend.VULKAN, "vulkaninfo", problem="vulkaninfo is not installed",
                      fix="`apt-get install vulkan-tools`")
RTX_4090 = SeenGpu("NVIDIA GeForce RTX 4090", "nvml", "550.54.15", 24564, 23928)
L4 = SeenGpu("NVIDIA L4", "nvml", "595.91.07", 23034, 22566)


def _tool(program: str, version: str | None = None) -> Tool:
    return Tool(program, f"/usr/bin/{program}", version or f"{program} 1.0")


def _machine(**changes: object) -> DoctorFacts:
    """A CPU machine with everything a CPU run needs and no GPU at all."""
    facts = DoctorFacts(
        python_version="3.11.7", python_executable="/repo/.venv/bin/python",
        packages=(Package("pytest", "9.2.0", "9.2.0"), Package("httpx", "0.28.1", "0.28.1")),
        cmake=_tool("cmake", "cmake version 3.25.1"), compiler=_tool("c++", "g++ 12.2.0"),
        build_tool=_tool("ninja", "ninja 1.11.1"), node=_tool("node", "v20.20.2"),
        allure=AllureFacts("3.18.0"),
        docker=DockerFacts(problem="no Docker engine answers (no socket); start one as root"),
        devices=DeviceFacts(user="ci", user_groups=("ci",), host_groups=("video", "render")),
        cache=CacheFacts("/cache", True, (CachedBuild("cpu-1234", Backend.CPU, "b1"),)),
        store=StoreFacts("sqlite:////cache/results.sqlite"), service=ServiceFacts(),
        gpu_compilers=MappingProxyType({b: Tool(p) for b, (p, _, _) in GPU_COMPILERS.items()}),
        gpus=MappingProxyType({Backend.CUDA: NO_NVIDIA, Backend.ROCM: NO_AMD,
                               Backend.VULKAN: NO_VULKAN}),
        gpu_configs=CONFIGS)
    return dataclasses.replace(facts, **changes)  # type: ignore[arg-type]


WHEEL_CUBLAS = Cublas(CublasOrigin.WHEEL, "13.1.1.3", "/venv/nvidia/cu13/include",
                      "/venv/nvidia/cu13/lib/libcublas.so.13",
                      "/venv/nvidia/cu13/lib/libcublasLt.so.13", "nvidia-cublas")
CUDA_13 = CudaToolkit("/usr/local/cuda-13.0/bin/nvcc", "13.0.88", "/usr/local/cuda-13.0",
                      WHEEL_CUBLAS,
                      DriverLibrary(DriverLibraryOrigin.DRIVER,
                                    "/usr/lib/x86_64-linux-gnu/libcuda.so.1"))


def _cuda_machine(*gpus: SeenGpu, toolkit: CudaToolkit | None = CUDA_13) -> DoctorFacts:
    return _machine(
        gpus=MappingProxyType({Backend.CUDA: GpuHealth(Backend.CUDA, "nvml", gpus=gpus),
                               Backend.ROCM: NO_AMD, Backend.VULKAN: NO_VULKAN}),
        gpu_compilers=MappingProxyType({
            Backend.CUDA: _tool("nvcc", "Cuda compilation tools, release 12.4"),
            Backend.ROCM: Tool("hipcc"), Backend.VULKAN: Tool("glslc")}),
        cuda=toolkit)


def _row(rows: tuple[Row, ...], check: str) -> Row:
    found = [row for row in rows if row.check == check]
    assert found, f"no row {check!r} in {[r.check for r in rows]}"
    return found[0]


# --- synthetic machines ---------------------------------------------------------------


def test_a_cuda_machine_with_an_rtx_4090_gets_its_config_by_name_and_can_run_cuda() -> None:
    rows = doctor_rows(_cuda_machine(RTX_4090), Backend.CUDA)
    gpu = _row(rows, "cuda GPU 0 via nvml")
    assert (gpu.status, gpu.required) == (Status.OK, True)
    assert "NVIDIA GeForce RTX 4090 (driver 550.54.15, 24564 MiB, 23928 MiB free)" in gpu.detail
    config = _row(rows, "config for cuda GPU 0")
    assert (config.status, config.detail) == (Status.OK, "rtx-4090 by name")
    assert _row(rows, "CUDA compiler (nvcc)").status is Status.OK
    assert exit_code(rows) == 0


def test_a_cuda_machine_names_its_cublas_and_libcuda() -> None:
    rows = doctor_rows(_cuda_machine(RTX_4090), Backend.CUDA)
    cublas = _row(rows, "cuBLAS")
    assert (cublas.status, cublas.required) == (Status.OK, True)
    assert cublas.detail == ("cuBLAS 13.1.1.3 from the nvidia-cublas wheel "
                             "(/venv/nvidia/cu13/lib)")
    libcuda = _row(rows, "CUDA driver library (libcuda)")
    assert libcuda.status is Status.OK
    assert "/usr/lib/x86_64-linux-gnu/libcuda.so.1 (the driver)" in libcuda.detail


def test_nvcc_without_cublas_warns_and_fails_a_cuda_run_with_the_wheel_to_install() -> None:
    toolkit = dataclasses.replace(CUDA_13, cublas=None,
                                  cublas_problem="no nvidia-cublas 13.x wheel is installed")
    for backend, status in ((None, Status.WARN), (Backend.CUDA, Status.FAIL)):
        row = _row(doctor_rows(_cuda_machine(RTX_4090, toolkit=toolkit), backend), "cuBLAS")
        assert row.status is status
        assert "not found for nvcc 13.0.88: no nvidia-cublas 13.x wheel" in row.detail
        assert "`pip install nvidia-cublas`" in row.fix
    assert exit_code(doctor_rows(_cuda_machine(RTX_4090, toolkit=toolkit), Backend.CUDA)) == 1


def test_no_libcuda_names_the_driver_and_the_no_vmm_build() -> None:
    toolkit = dataclasses.replace(CUDA_13, driver=None)
    row = _row(doctor_rows(_cuda_machine(toolkit=toolkit), None),
               "CUDA driver library (libcuda)")
    assert row.status is Status.WARN
    assert "-DGGML_CUDA_NO_VMM=ON" in row.fix


def test_without_nvcc_cublas_is_not_looked_for() -> None:
    rows = doctor_rows(_machine(), None)
    assert _row(rows, "cuBLAS").status is Status.NA
    assert _row(rows, "CUDA driver library (libcuda)").status is Status.NA


def test_a_gpu_no_config_names_falls_to_a_bucket_loudly_but_does_not_fail() -> None:
    rows = doctor_rows(_cuda_machine(L4), Backend.CUDA)
    config = _row(rows, "config for cuda GPU 0")
    assert config.status is Status.WARN
    assert config.detail.startswith("bucket fallback: no config names 'NVIDIA L4'; VRAM "
                                    "bucket 'mid' (18-28 GiB) for 23034 MiB lends rtx-3090's "
                                    "settings, not a tuned profile")
    assert "configs/gpu/<card>.json" in config.fix
    assert exit_code(rows) == 0
    assert verdict(rows, Backend.CUDA).startswith("doctor: a cuda run can go ahead")


def test_a_name_match_with_too_little_vram_says_why_the_bucket_decided() -> None:
    laptop_slice = SeenGpu("NVIDIA GeForce RTX 4090", "nvml", "550.54.15", 16376, 16000)
    row = config_row("config", laptop_slice, Backend.CUDA, CONFIGS)
    assert row.status is Status.WARN
    assert "bucket fallback" in row.detail
    assert "the name matches 'rtx-4090' but 16376 MiB is under" in row.detail


def test_a_gpu_below_the_smallest_bucket_gets_no_config() -> None:
    apu = SeenGpu("Rembrandt [Radeon 680M]", "rocm-smi", None, 512, 87)
    row = config_row("config", apu, Backend.ROCM, CONFIGS)
    assert row.status is Status.WARN
    assert "no config" in row.detail
    assert "smallest VRAM bucket 'tiny'" in row.detail


def test_a_vulkan_gpu_without_vram_is_matched_by_name_or_warned() -> None:
    radv = SeenGpu("AMD Radeon RX 7900 XTX (RADV NAVI31)", "vulkaninfo", "radv Mesa 25.0.2")
    assert config_row("c", radv, Backend.VULKAN, CONFIGS).detail.startswith(
        "rx-7900-xtx by name")
    intel = SeenGpu("Intel(R) Graphics (RPL-S)", "vulkaninfo", "Mesa 25.2.8")
    row = config_row("c", intel, Backend.VULKAN, CONFIGS)
    assert row.status is Status.WARN
    assert row.detail.startswith("bucket fallback: no config names 'Intel(R) Graphics (RPL-S)'")


def test_a_machine_without_gpus_is_fine_for_cpu_and_reports_gpus_as_na() -> None:
    rows = doctor_rows(_machine(), Backend.CPU)
    nvml = _row(rows, "cuda GPUs via nvml")
    assert (nvml.status, nvml.required) == (Status.NA, False)
    assert _row(rows, "vulkan GPUs via vulkaninfo").status is Status.NA
    assert _row(rows, "CUDA compiler (nvcc)").status is Status.NA
    assert exit_code(rows) == 0
    assert exit_code(doctor_rows(_machine(), None)) == 0


def test_a_machine_without_gpus_cannot_run_cuda_and_each_failure_has_a_fix() -> None:
    rows = doctor_rows(_machine(), Backend.CUDA)
    nvml = _row(rows, "cuda GPUs via nvml")
    assert (nvml.status, nvml.required) == (Status.FAIL, True)
    assert nvml.detail.startswith("no NVIDIA driver on this runner")
    assert "apt-get install nvidia-driver" in nvml.fix
    nvcc = _row(rows, "CUDA compiler (nvcc)")
    assert (nvcc.status, nvcc.fix) == (Status.FAIL, "`apt-get install nvidia-cuda-toolkit`")
    assert exit_code(rows) == 1
    assert verdict(rows, Backend.CUDA) == (
        "doctor: a cuda run cannot go ahead on this machine; fix: CUDA compiler (nvcc), "
        "cuda GPUs via nvml")


def test_rocm_needs_kfd_dri_and_the_groups() -> None:
    rows = doctor_rows(_machine(), Backend.ROCM)
    assert _row(rows, "/dev/kfd").status is Status.FAIL
    assert "modprobe amdgpu" in _row(rows, "/dev/kfd").fix
    assert _row(rows, "/dev/dri").status is Status.FAIL
    groups = _row(rows, "video/render groups")
    assert (groups.status, groups.fix) == (
        Status.FAIL, "`usermod -aG video,render ci`, then log in again")
    # The same machine asked for nothing GPU-related: the rows are only informative.
    assert _row(doctor_rows(_machine(), None), "/dev/kfd").status is Status.NA


def test_root_may_open_the_device_nodes() -> None:
    devices = DeviceFacts(kfd=True, dri=True, render_nodes=("/dev/dri/renderD128",),
                          user="root", is_root=True, host_groups=("video", "render"))
    rows = doctor_rows(_machine(devices=devices), Backend.ROCM)
    assert [_row(rows, c).status for c in ("/dev/kfd", "/dev/dri", "video/render groups")] \
        == [Status.OK] * 3


def test_a_missing_package_or_compiler_fails_even_without_a_backend() -> None:
    rows = doctor_rows(_machine(packages=(Package("gguf", None, "0.19.0"),)), None)
    assert _row(rows, "package gguf").status is Status.FAIL
    assert "bash scripts/setup.sh" in _row(rows, "package gguf").fix
    assert exit_code(rows) == 1
    rows = doctor_rows(_machine(compiler=Tool("c++")), None)
    assert (_row(rows, "C++ compiler").status, _row(rows, "C++ compiler").fix) == (
        Status.FAIL, "`apt-get install g++`")


def test_a_package_off_its_pin_warns() -> None:
    rows = doctor_rows(_machine(packages=(Package("httpx", "0.27.0", "0.28.1"),)), None)
    assert _row(rows, "package httpx").detail == "0.27.0, but constraints.txt pins 0.28.1"
    assert exit_code(rows) == 0


def test_optional_pieces_warn_with_their_fix_and_never_fail() -> None:
    facts = _machine(allure=AllureFacts(None, "node is not installed, and the Allure report "
                                              "CLI runs on it; install Node.js 20"),
                     store=StoreFacts("postgresql://u:***@db/h", "cannot open the results "
                                      "store at postgresql://u:***@db/h: refused; is the "
                                      "server running?"),
                     service=ServiceFacts("http://127.0.0.1:9", problem="no answer"))
    rows = doctor_rows(facts, Backend.CPU)
    allure = _row(rows, "Allure CLI")
    assert (allure.status, allure.fix) == (Status.WARN, "install Node.js 20")
    assert _row(rows, "results store").status is Status.WARN
    assert _row(rows, "results service").status is Status.WARN
    assert _row(rows, "Docker engine").status is Status.WARN
    assert exit_code(rows) == 0


def test_the_compiler_cache_is_optional_and_names_its_fix_or_setting() -> None:
    found = _row(doctor_rows(_machine(ccache=_tool("ccache", "ccache version 4.7.5")), None),
                 "compiler cache (ccache)")
    assert (found.status, found.required) == (Status.OK, False)
    assert "ccache version 4.7.5 (/usr/bin/ccache)" in found.detail
    missing = _row(doctor_rows(_machine(), None), "compiler cache (ccache)")
    assert missing.status == Status.WARN
    assert "apt-get install ccache" in missing.fix
    off = _row(doctor_rows(_machine(ccache_setting="0"), Backend.CPU),
               "compiler cache (ccache)")
    assert off.status == Status.NA
    assert "HARNESS_CCACHE=0" in off.detail


def test_the_nvidia_container_runtime_matters_only_with_an_nvidia_gpu() -> None:
    engine = DockerFacts(version="26.1.5", runtimes=("io.containerd.runc.v2", "runc"))
    rows = doctor_rows(_machine(docker=engine), None)
    assert _row(rows, "NVIDIA container runtime").status is Status.NA
    facts = dataclasses.replace(_cuda_machine(RTX_4090), docker=engine)
    runtime = _row(doctor_rows(facts, None), "NVIDIA container runtime")
    assert runtime.status is Status.WARN
    assert "nvidia-ctk runtime configure" in runtime.fix


def test_a_broken_gpu_config_fails_every_run() -> None:
    rows = doctor_rows(_machine(gpu_configs=(), gpu_configs_problem="configs/gpu/x.json: "
                                "$.vram_gib: -1 is not allowed\nsecond problem"), None)
    row = _row(rows, "GPU configs (configs/gpu)")
    assert (row.status, row.detail) == (
        Status.FAIL, "configs/gpu/x.json: $.vram_gib: -1 is not allowed (and 1 more)")
    assert exit_code(rows) == 1


def test_the_gpu_compiler_table_agrees_with_the_toolchain_probe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    for backend, (program, package, _) in GPU_COMPILERS.items():
        monkeypatch.setattr("harness.probes.toolchain.shutil.which",
                            lambda name, missing=program: None if name == missing
                            else f"/usr/bin/{name}")
        with pytest.raises(ToolMissingError) as caught:
            toolchain.find_toolchain(backend)
        assert f"({program})" in str(caught.value)
        assert f"`apt-get install {package}`" in str(caught.value)


# --- gathering on this machine --------------------------------------------------------


class _Healthz(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200 if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, *_: object) -> None:
        pass


@pytest.fixture
def healthz_url() -> Iterator[str]:
    server = HTTPServer(("127.0.0.1", 0), _Healthz)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_results_service_is_asked_for_healthz(monkeypatch: pytest.MonkeyPatch,
                                                   healthz_url: str) -> None:
    monkeypatch.setenv(gather.SERVICE_URL_ENV, healthz_url + "/")
    assert gather._service() == ServiceFacts(healthz_url, status=200)


def test_a_results_service_that_does_not_answer_is_a_problem(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(gather.SERVICE_URL_ENV, "http://127.0.0.1:9")
    facts = gather._service()
    assert facts.status is None
    assert facts.problem is not None
    assert facts.problem.startswith("no answer (ConnectError")


def test_constraints_pins_are_read_by_normalised_name(tmp_path: Path) -> None:
    path = tmp_path / "constraints.txt"
    path.write_text("SQLAlchemy==2.1.9\nallure_pytest==2.16.2  # report\n-e .\n")
    assert read_constraints(path) == {"sqlalchemy": "2.1.9", "allure-pytest": "2.16.2"}


# --- the real command -----------------------------------------------------------------




@pytest.fixture
def isolated(tmp_path: Path) -> dict[str, str | None]:
    """The command's environment: its own cache and store, no service."""
    return {"HARNESS_CACHE": str(tmp_path / "cache"), "HARNESS_RESULTS_URL": None,
            gather.SERVICE_URL_ENV: None}


def test_doctor_for_cpu_exits_0_here_with_gpu_rows_not_applicable(
        isolated: dict[str, str | None]) -> None:
    result = CliRunner().invoke(doctor_command, ["--backend", "cpu"], env=isolated)
    assert result.exit_code == 0, result.output
    assert "cuda GPUs via nvml" in result.output
    assert "doctor: a cpu run can go ahead on this machine" in result.output


def test_doctor_json_parses_and_marks_no_gpu_rows_not_required(
        isolated: dict[str, str | None]) -> None:
    result = CliRunner().invoke(doctor_command, ["--backend", "cpu", "--json"], env=isolated)
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert (report["backend"], report["exit_code"]) == ("cpu", 0)
    rows = {row["check"]: row for row in report["rows"]}
    assert rows["package pytest"]["status"] == "ok"
    gpu_rows = [row for check, row in rows.items() if check.startswith("cuda GPU")]
    assert gpu_rows
    if not gpu_helpers.nvml_answers():
        assert [(r["status"], r["required"]) for r in gpu_rows] == [("n/a", False)]
    assert rows["results store"]["detail"].startswith("opens: sqlite:///")


@pytest.mark.skipif(not Path("/usr/local/cuda/bin/nvcc").exists(),
                    reason="no CUDA toolkit at /usr/local/cuda")
def test_doctor_finds_nvcc_off_path_and_the_cublas_a_build_would_use(
        isolated: dict[str, str | None]) -> None:
    result = CliRunner().invoke(doctor_command, ["--json"], env=isolated)
    rows = {row["check"]: row for row in json.loads(result.output)["rows"]}
    nvcc = rows["CUDA compiler (nvcc)"]
    assert nvcc["status"] == "ok"
    assert nvcc["detail"].startswith("nvcc 13.")
    assert rows["cuBLAS"]["status"] in ("ok", "warn")
    if rows["cuBLAS"]["status"] == "warn":
        assert "pip install nvidia-cublas" in rows["cuBLAS"]["fix"]


@pytest.mark.skipif(gpu_helpers.nvml_answers(), reason="NVML answers on this machine")
def test_doctor_for_cuda_exits_1_here_and_names_the_driver_fix(
        isolated: dict[str, str | None]) -> None:
    result = CliRunner().invoke(doctor_command, ["--backend", "cuda", "--json"], env=isolated)
    assert result.exit_code == 1, result.output
    report = json.loads(result.output)
    nvml = next(row for row in report["rows"] if row["check"] == "cuda GPUs via nvml")
    assert (nvml["status"], nvml["required"]) == ("fail", True)
    assert "no NVIDIA driver" in nvml["detail"]
    assert "apt-get install nvidia-driver" in nvml["fix"]
    assert "cuda GPUs via nvml" in report["verdict"]
