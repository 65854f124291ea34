"""What ``harness doctor`` found on a machine: plain data, gathered once, judged elsewhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from harness.facts.build import Backend
from harness.facts.cuda_toolkit import CudaToolkit
from harness.facts.gpu import GpuConfig
from harness.probes.gpu_tool_readers import GpuHealth


@dataclass(frozen=True)
class Tool:
    """A program on PATH (None when absent) and the line of its ``--version`` that names it."""

    program: str
    path: str | None = None
    version: str | None = None


@dataclass(frozen=True)
class Package:
    name: str
    #: Installed version, None when not installed.
    version: str | None
    #: The version constraints.txt pins, None when it pins none.
    pinned: str | None = None


@dataclass(frozen=True)
class AllureFacts:
    #: The installed generator's version; None when ``allure_command()`` refused.
    version: str | None
    #: ``allure_command()``'s refusal (names the problem and the fix).
    problem: str | None = None
    #: The CLI that runs (``$HARNESS_ALLURE``, node_modules, or ``PATH``).
    path: str | None = None


@dataclass(frozen=True)
class DockerFacts:
    version: str | None = None
    #: The runtimes ``docker info`` lists (``runc``, ``nvidia``...).
    runtimes: tuple[str, ...] = ()
    #: Why no engine answers (names the fix); None when one does.
    problem: str | None = None


@dataclass(frozen=True)
class DeviceFacts:
    """GPU device nodes and whether this user may open them (ROCm and Vulkan need them)."""

    kfd: bool = False
    kfd_openable: bool = False
    dri: bool = False
    render_nodes: tuple[str, ...] = ()
    dri_openable: bool = False
    user: str = "unknown"
    is_root: bool = False
    #: The groups this process is in, by name.
    user_groups: tuple[str, ...] = ()
    #: Which of ``video`` and ``render`` exist on this host.
    host_groups: tuple[str, ...] = ()


@dataclass(frozen=True)
class CachedBuild:
    key: str
    backend: Backend
    version: str


@dataclass(frozen=True)
class CacheFacts:
    root: str
    writable: bool
    builds: tuple[CachedBuild, ...] = ()
    #: Build records that could not be read, each with why.
    unreadable: tuple[str, ...] = ()


@dataclass(frozen=True)
class StoreFacts:
    #: The results URL with any password hidden.
    url: str
    problem: str | None = None


@dataclass(frozen=True)
class ServiceFacts:
    """``HARNESS_SERVICE_URL`` and what its ``/healthz`` answered."""

    url: str | None = None
    status: int | None = None
    problem: str | None = None


def _no_tools() -> Mapping[Backend, Tool]:
    return MappingProxyType({})


def _no_gpus() -> Mapping[Backend, GpuHealth]:
    return MappingProxyType({})


@dataclass(frozen=True)
class DoctorFacts:
    python_version: str
    python_executable: str
    packages: tuple[Package, ...]
    cmake: Tool
    compiler: Tool
    #: ``ninja`` when present, else ``make`` (what the build would use).
    build_tool: Tool
    node: Tool
    allure: AllureFacts
    docker: DockerFacts
    devices: DeviceFacts
    cache: CacheFacts
    store: StoreFacts
    service: ServiceFacts
    #: The GPU compiler of each GPU backend (nvcc, hipcc, glslc).
    gpu_compilers: Mapping[Backend, Tool] = field(default_factory=_no_tools)
    #: The CUDA toolkit a native CUDA build would use (nvcc, cuBLAS, libcuda); None when
    #: no nvcc was found.
    cuda: CudaToolkit | None = None
    #: What each GPU backend's vendor tool sees.
    gpus: Mapping[Backend, GpuHealth] = field(default_factory=_no_gpus)
    gpu_configs: tuple[GpuConfig, ...] = ()
    #: Why configs/gpu could not be loaded, None when it was.
    gpu_configs_problem: str | None = None
    #: The compiler cache native builds would use (``HARNESS_CCACHE``).
    ccache: Tool = field(default_factory=lambda: Tool("ccache"))
    #: ``HARNESS_CCACHE`` as set ("" when unset).
    ccache_setting: str = ""
