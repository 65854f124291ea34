"""From what ``harness doctor`` found to table rows and an exit verdict (pure).

A row is ``fail`` only when the run asked for cannot do without it. Every run needs
Python, the key packages, the build toolchain and the GPU configs; ``--backend X`` adds
what X needs (its GPU compiler, a usable GPU its vendor tool lists, for ROCm and Vulkan
the device nodes and the groups that open them, a writable build cache; for CUDA also
cuBLAS and the libcuda a native build links). What a run can
do without is ``warn`` when it is missing or degraded (no Allure, no Docker engine, a
GPU that falls back on a VRAM bucket) and ``n/a`` when this machine has no such thing.

The module stays whole because it is one table: every row below applies that one rule to
one fact, and ``doctor_rows`` lists them in the order a reader fixes things, which is
easiest to check with the rows side by side.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from harness.builds.compiler_cache import CCACHE_ENV, ccache_program
from harness.doctor.facts import DoctorFacts, Tool
from harness.errors import ConfigError
from harness.facts.build import GPU_BACKENDS, Backend
from harness.facts.gpu import GpuConfig
from harness.planning.autotune import TuneSource, autotune, match_config
from harness.planning.build_plan import NO_VMM_FLAG, cublas_fix
from harness.probes.gpu_access import NVIDIA_RUNTIME, NVIDIA_TOOLKIT_HINT
from harness.probes.gpu_tool_readers import AMDGPU_FIX, SeenGpu

MIN_PYTHON = (3, 11)
SETUP_FIX = ("run `bash scripts/setup.sh` (or `.venv/bin/python -m pip install "
             "-c harness/resources/constraints.txt -e '.[dev]'`)")
#: The compiler each GPU backend's build needs and the Debian package that has it: the
#: same table as harness/probes/toolchain.py's (tests/test_doctor.py checks they agree).
GPU_COMPILERS: dict[Backend, tuple[str, str, str]] = {
    Backend.CUDA: ("nvcc", "nvidia-cuda-toolkit", "CUDA compiler"),
    Backend.ROCM: ("hipcc", "hipcc", "HIP compiler"),
    Backend.VULKAN: ("glslc", "glslc", "GLSL shader compiler"),
}
ADD_CONFIG_FIX = ("add configs/gpu/<card>.json whose `match` pattern finds this name "
                  "(fields: configs/gpu/README.md)")
GROUPS = ("video", "render")


class Status(enum.StrEnum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"
    NA = "n/a"


@dataclass(frozen=True)
class Row:
    check: str
    status: Status
    detail: str
    fix: str = ""
    #: Whether the run asked for needs this (a required row that is broken fails).
    required: bool = False

    def to_json(self) -> dict[str, object]:
        return {"check": self.check, "status": self.status.value, "detail": self.detail,
                "fix": self.fix, "required": self.required}


def doctor_rows(facts: DoctorFacts, backend: Backend | None) -> tuple[Row, ...]:
    """Every check, in the order a reader fixes things: Python up to the results service."""
    return (
        _python_row(facts),
        *(_package_row(p.name, p.version, p.pinned) for p in facts.packages),
        *_toolchain_rows(facts, backend),
        *_report_rows(facts),
        *_docker_rows(facts),
        *_device_rows(facts, backend),
        *_gpu_rows(facts, backend),
        _configs_row(facts),
        _cache_row(facts, backend),
        _store_row(facts),
        _service_row(facts),
    )


def exit_code(rows: Iterable[Row]) -> int:
    """1 when any row fails (something the run needs is broken), else 0."""
    return 1 if failing(rows) else 0


def failing(rows: Iterable[Row]) -> tuple[Row, ...]:
    return tuple(row for row in rows if row.status is Status.FAIL)


def verdict(rows: Sequence[Row], backend: Backend | None) -> str:
    """The closing line: what can run here, or what stops it."""
    broken = failing(rows)
    what = f"a {backend.value} run" if backend is not None else "a run"
    if not broken:
        warned = sum(1 for row in rows if row.status is Status.WARN)
        tail = f" ({warned} warning{'s' * (warned != 1)})" if warned else ""
        return f"doctor: {what} can go ahead on this machine{tail}"
    return (f"doctor: {what} cannot go ahead on this machine; fix: "
            + ", ".join(row.check for row in broken))


# --- rows -----------------------------------------------------------------------------


def _needed(check: str, required: bool, detail: str, fix: str,
            otherwise: Status = Status.NA) -> Row:
    """A row for something missing: a failure when needed, ``otherwise`` when not."""
    return Row(check, Status.FAIL if required else otherwise, detail, fix, required)


def _python_row(facts: DoctorFacts) -> Row:
    parts = tuple(int(p) for p in facts.python_version.split(".")[:2] if p.isdigit())
    detail = f"{facts.python_version} ({facts.python_executable})"
    if parts >= MIN_PYTHON:
        return Row("Python", Status.OK, detail, required=True)
    return Row("Python", Status.FAIL, f"{detail} is older than 3.11",
               "install Python 3.11 or newer and recreate .venv with `bash scripts/setup.sh`",
               required=True)


def _package_row(name: str, version: str | None, pinned: str | None) -> Row:
    check = f"package {name}"
    if version is None:
        return Row(check, Status.FAIL, "not installed", SETUP_FIX, required=True)
    if pinned is not None and version != pinned:
        return Row(check, Status.WARN, f"{version}, but constraints.txt pins {pinned}",
                   SETUP_FIX, required=True)
    return Row(check, Status.OK, version + (" (as pinned)" if pinned else ""), required=True)


def _tool_row(check: str, tool: Tool, package: str) -> Row:
    if tool.path is None:
        return Row(check, Status.FAIL, f"{tool.program} is not installed",
                   f"`apt-get install {package}`", required=True)
    return Row(check, Status.OK, f"{tool.version or tool.program} ({tool.path})", required=True)


def _toolchain_rows(facts: DoctorFacts, backend: Backend | None) -> list[Row]:
    rows = [_tool_row("CMake", facts.cmake, "cmake"),
            _tool_row("C++ compiler", facts.compiler, "g++"),
            _tool_row("make or ninja", facts.build_tool, "ninja-build")]
    for gpu_backend, (program, package, what) in GPU_COMPILERS.items():
        check = f"{what} ({program})"
        tool = facts.gpu_compilers.get(gpu_backend, Tool(program))
        required = backend is gpu_backend
        if tool.path is not None:
            rows.append(Row(check, Status.OK, f"{tool.version or program} ({tool.path})",
                            required=required))
            continue
        health = facts.gpus.get(gpu_backend)
        # A GPU this machine could use but cannot build for is worth a warning.
        here = health is not None and health.usable
        rows.append(_needed(
            check, required,
            f"not installed: no {gpu_backend.value} build can be made here"
            + (f" although a {gpu_backend.value} GPU is" if here else ""),
            f"`apt-get install {package}`", Status.WARN if here else Status.NA))
    rows.extend(_cuda_library_rows(facts, backend))
    rows.append(_ccache_row(facts))
    return rows


def _ccache_row(facts: DoctorFacts) -> Row:
    """Optional: without a compiler cache every build compiles every file."""
    check = "compiler cache (ccache)"
    if ccache_program(facts.ccache_setting) is None:
        return Row(check, Status.NA, f"off: {CCACHE_ENV}={facts.ccache_setting}")
    tool = facts.ccache
    if tool.path is None:
        return Row(check, Status.WARN,
                   f"{tool.program} is not installed: every build compiles every file (the "
                   "A/B tests' slowed build about 6 min instead of 30 s on 2 cores)",
                   "`apt-get install ccache` (or `HARNESS_CCACHE=PATH`)")
    return Row(check, Status.OK, f"{tool.version or tool.program} ({tool.path}): builds of "
               "nearby sources share their objects")


def _cuda_library_rows(facts: DoctorFacts, backend: Backend | None) -> list[Row]:
    """cuBLAS and libcuda, which a native CUDA build links beside nvcc.

    Looked for only where there is an nvcc (its row says when there is none). Missing with
    an nvcc present warns: this machine looks meant to build CUDA.
    """
    required = backend is Backend.CUDA
    toolkit = facts.cuda
    if toolkit is None:
        return [Row("cuBLAS", Status.NA, "not looked for: no nvcc", required=required),
                Row("CUDA driver library (libcuda)", Status.NA, "not looked for: no nvcc",
                    required=required)]
    if toolkit.cublas is not None:
        rows = [Row("cuBLAS", Status.OK, toolkit.cublas.describe(), required=required)]
    else:
        rows = [_needed("cuBLAS", required,
                        f"not found for nvcc {toolkit.version}: {toolkit.cublas_problem}",
                        cublas_fix(toolkit.major), Status.WARN)]
    check = "CUDA driver library (libcuda)"
    if toolkit.driver is not None:
        rows.append(Row(check, Status.OK, f"{toolkit.driver.path} (the "
                        f"{toolkit.driver.origin.value}), which ggml-cuda links",
                        required=required))
    else:
        rows.append(_needed(
            check, required,
            f"no libcuda.so: neither a link stub under {toolkit.root} nor an NVIDIA "
            "driver's libcuda.so.1; a CUDA build links it for ggml-cuda's VMM pool",
            f"install the NVIDIA driver, or build with --cmake-arg {NO_VMM_FLAG}",
            Status.WARN))
    return rows


def _report_rows(facts: DoctorFacts) -> list[Row]:
    rows = []
    if facts.node.path is None:
        rows.append(Row("node", Status.WARN,
                        "not installed: the Allure report cannot be rendered",
                        "`apt-get install nodejs npm`, then `bash scripts/setup.sh`"))
    else:
        rows.append(Row("node", Status.OK, f"{facts.node.version} ({facts.node.path})"))
    if facts.allure.problem is not None:
        detail, fix = _split(facts.allure.problem)
        rows.append(Row("Allure CLI", Status.WARN, detail, fix))
    else:
        rows.append(Row("Allure CLI", Status.OK,
                        f"allure {facts.allure.version}, the pinned release "
                        f"({facts.allure.path})"))
    return rows


def _docker_rows(facts: DoctorFacts) -> list[Row]:
    docker = facts.docker
    if docker.problem is not None:
        detail, fix = _split(docker.problem)
        return [Row("Docker engine", Status.WARN,
                    f"{detail} (only the container runner and image builds need one)", fix),
                Row("NVIDIA container runtime", Status.NA, "no Docker engine to ask")]
    rows = [Row("Docker engine", Status.OK, f"Docker {docker.version}")]
    runtimes = ", ".join(docker.runtimes) or "none"
    if NVIDIA_RUNTIME in docker.runtimes:
        rows.append(Row("NVIDIA container runtime", Status.OK, f"runtimes: {runtimes}"))
    else:
        nvidia = facts.gpus.get(Backend.CUDA)
        here = nvidia is not None and nvidia.usable
        rows.append(Row(
            "NVIDIA container runtime", Status.WARN if here else Status.NA,
            f"not registered (runtimes: {runtimes}); CUDA containers need it"
            + (" and this machine has an NVIDIA GPU" if here else ""),
            NVIDIA_TOOLKIT_HINT))
    return rows


def _device_rows(facts: DoctorFacts, backend: Backend | None) -> list[Row]:
    dev = facts.devices
    needs_kfd = backend is Backend.ROCM
    needs_dri = backend in (Backend.ROCM, Backend.VULKAN)
    regroup = _regroup_fix(dev.user, [g for g in dev.host_groups if g not in dev.user_groups])
    rows = []
    if not dev.kfd:
        rows.append(_needed("/dev/kfd", needs_kfd,
                            "absent: the amdgpu compute driver (ROCm's KFD) is not loaded",
                            AMDGPU_FIX))
    elif dev.kfd_openable or dev.is_root:
        rows.append(Row("/dev/kfd", Status.OK, "present, and this user may open it",
                        required=needs_kfd))
    else:
        rows.append(_needed("/dev/kfd", needs_kfd, "present, but this user may not open it",
                            regroup, Status.WARN))
    nodes = ", ".join(dev.render_nodes) or "no render node"
    if not dev.dri:
        rows.append(_needed("/dev/dri", needs_dri,
                            "absent: no GPU kernel driver exposes a render node",
                            "load the GPU's kernel driver (amdgpu, i915/xe, nvidia-drm); in a "
                            "container pass `--device /dev/dri`"))
    elif dev.dri_openable or dev.is_root:
        rows.append(Row("/dev/dri", Status.OK, f"present ({nodes}), and this user may open it",
                        required=needs_dri))
    else:
        rows.append(_needed("/dev/dri", needs_dri,
                            f"present ({nodes}), but this user may not open it", regroup,
                            Status.WARN))
    rows.append(_groups_row(facts, needs_dri, regroup))
    return rows


def _groups_row(facts: DoctorFacts, required: bool, fix: str) -> Row:
    dev = facts.devices
    check = "video/render groups"
    if dev.is_root:
        return Row(check, Status.OK, f"user {dev.user} is root, who may open every device node",
                   required=required)
    missing = [g for g in dev.host_groups if g not in dev.user_groups]
    if not missing:
        return Row(check, Status.OK,
                   f"user {dev.user} is in {', '.join(dev.host_groups) or 'no such group'}",
                   required=required)
    devices_here = dev.kfd or dev.dri
    return _needed(check, required, f"user {dev.user} is not in {', '.join(missing)}", fix,
                   Status.WARN if devices_here else Status.NA)


def _regroup_fix(user: str, missing: Sequence[str]) -> str:
    groups = ",".join(missing or GROUPS)
    return f"`usermod -aG {groups} {user}`, then log in again"


def _gpu_rows(facts: DoctorFacts, backend: Backend | None) -> list[Row]:
    rows: list[Row] = []
    for gpu_backend in GPU_BACKENDS:
        health = facts.gpus.get(gpu_backend)
        required = backend is gpu_backend
        if health is None:
            rows.append(_needed(f"{gpu_backend.value} GPUs", required, "not probed",
                                "run `harness doctor` again"))
            continue
        if not health.usable:
            rows.append(_needed(f"{gpu_backend.value} GPUs via {health.source}", required,
                                health.problem or "no GPU listed", health.fix or ""))
            continue
        for index, gpu in enumerate(health.gpus):
            name = f"{gpu_backend.value} GPU {index}"
            rows.append(Row(f"{name} via {gpu.source}", Status.OK, gpu.describe(),
                            required=required))
            if facts.gpu_configs_problem is None:
                rows.append(config_row(f"config for {name}", gpu, gpu_backend,
                                       facts.gpu_configs))
        rows.extend(Row(f"{gpu_backend.value} software device", Status.NA,
                        f"{gpu.describe()}: a CPU implementation, left out")
                    for gpu in health.software)
    return rows


def config_row(check: str, gpu: SeenGpu, backend: Backend,
               configs: Sequence[GpuConfig]) -> Row:
    """Which configs/gpu entry ``gpu`` gets, and whether by name or by VRAM bucket.

    A bucket is a fallback, not a tuned profile, so it is a warning that says so.
    """
    info = gpu.gpu_info(backend)
    if info is None:
        matched = match_config(gpu.name, configs)
        if matched is not None:
            return Row(check, Status.OK,
                       f"{matched.name} by name ({gpu.source} gives no VRAM size; the plan "
                       "checks it against the build's --list-devices)")
        return Row(check, Status.WARN,
                   f"bucket fallback: no config names {gpu.name!r}, and {gpu.source} gives no "
                   "VRAM size, so a VRAM bucket from the build's --list-devices will lend "
                   "another card's settings", ADD_CONFIG_FIX)
    try:
        tuned = autotune(info, configs, None, {}, {})
    except ConfigError as exc:
        return Row(check, Status.WARN, str(exc), "correct configs/gpu (README.md there)")
    notes = "".join(f"; {note}" for note in tuned.reasons[1:])
    if tuned.source is TuneSource.MATCH and tuned.config is not None:
        return Row(check, Status.OK, f"{tuned.config.name} by name{notes}")
    if tuned.source is TuneSource.BUCKET and tuned.config is not None \
            and tuned.bucket is not None:
        return Row(check, Status.WARN,
                   f"bucket fallback: no config names {gpu.name!r}; VRAM bucket "
                   f"{tuned.bucket.describe()} for {info.vram_mib} MiB lends "
                   f"{tuned.config.name}'s settings, not a tuned profile{notes}",
                   ADD_CONFIG_FIX)
    below = tuned.bucket.describe() if tuned.bucket is not None else "none"
    return Row(check, Status.WARN,
               f"no config: no config names {gpu.name!r} and {info.vram_mib} MiB is in the "
               f"smallest VRAM bucket {below}, which lends none; catalog defaults stand{notes}",
               ADD_CONFIG_FIX)


def _configs_row(facts: DoctorFacts) -> Row:
    check = "GPU configs (configs/gpu)"
    if facts.gpu_configs_problem is not None:
        lines = facts.gpu_configs_problem.splitlines()
        more = f" (and {len(lines) - 1} more)" if len(lines) > 1 else ""
        return Row(check, Status.FAIL, lines[0] + more,
                   "correct the file named (fields: configs/gpu/README.md)", required=True)
    names = ", ".join(c.name for c in facts.gpu_configs)
    return Row(check, Status.OK, f"{len(facts.gpu_configs)} configs: {names}", required=True)


def _cache_row(facts: DoctorFacts, backend: Backend | None) -> Row:
    cache = facts.cache
    required = backend is not None
    if not cache.writable:
        return _needed("build cache", required, f"{cache.root} is not writable",
                       "set HARNESS_CACHE to a directory this user may write", Status.WARN)
    builds = ", ".join(f"{b.backend.value} {b.key}" for b in cache.builds) or "no builds yet"
    detail = f"{cache.root}: {builds}"
    if backend is not None and not any(b.backend is backend for b in cache.builds):
        detail += f"; no {backend.value} build cached, so the first run builds one"
    if cache.unreadable:
        return Row("build cache", Status.WARN,
                   f"{detail}; unreadable records: {'; '.join(cache.unreadable)}",
                   "delete the build directories named and build again", required)
    return Row("build cache", Status.OK, detail, required=required)


def _store_row(facts: DoctorFacts) -> Row:
    store = facts.store
    if store.problem is not None:
        detail, fix = _split(store.problem)
        return Row("results store", Status.WARN, detail, fix)
    return Row("results store", Status.OK, f"opens: {store.url}")


def _service_row(facts: DoctorFacts) -> Row:
    service = facts.service
    check = "results service"
    if service.url is None:
        return Row(check, Status.NA, "HARNESS_SERVICE_URL is not set: runs are not uploaded")
    fix = ("start it with `harness serve` (with HARNESS_SERVICE_TOKEN set), or correct "
           "HARNESS_SERVICE_URL")
    if service.problem is not None:
        return Row(check, Status.WARN, f"{service.url}/healthz: {service.problem}", fix)
    if service.status != 200:
        return Row(check, Status.WARN, f"{service.url}/healthz answered {service.status}", fix)
    return Row(check, Status.OK, f"{service.url}/healthz answered 200")


def _split(message: str) -> tuple[str, str]:
    """A harness error's two halves: what is wrong; what to do (they are joined by '; ')."""
    what, _, fix = message.partition("; ")
    return what, fix
