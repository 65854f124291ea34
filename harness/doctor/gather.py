"""Looks at this machine for ``harness doctor``: the only part that does I/O.

Each probe is the one the harness itself uses where there is one (the toolchain's
compiler version, ``allure_command()``, the Docker engine, the GPU vendor tools, the
results store), so what doctor reports is what a run will meet.
"""

from __future__ import annotations

import getpass
import grp
import importlib.metadata
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from types import MappingProxyType

from harness.builds.compiler_cache import AUTO_PROGRAM, CCACHE_ENV, ccache_program
from harness.builds.native import builds_dir, read_build_info
from harness.doctor.checks import GPU_COMPILERS, GROUPS
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
from harness.errors import HarnessError, ServiceError
from harness.facts.build import GPU_BACKENDS, Backend
from harness.facts.cuda_toolkit import CudaToolkit
from harness.paths import cache_root
from harness.probes.cuda_toolkit import find_cuda_toolkit
from harness.probes.docker_engine import docker_engine
from harness.probes.gpu_access import host_group_id, readable_and_writable
from harness.probes.gpu_configs import load_gpu_configs
from harness.probes.gpu_health import probe_gpus
from harness.probes.toolchain import compiler_version
from harness.report.allure_cli import allure_command, installed_version
from harness.resources.python_pins import normal_name, read_constraints
from harness.results.store import open_store
from harness.results.store_backends import default_url, display_url
from harness.service.service_client import ServiceCall

#: The packages a run imports, as their distributions are named.
KEY_PACKAGES = ("pytest", "allure-pytest", "httpx", "gguf", "sqlalchemy", "psycopg",
                "starlette", "uvicorn", "docker", "testcontainers")
SERVICE_URL_ENV = "HARNESS_SERVICE_URL"
_TIMEOUT_S = 10.0
#: ``/healthz`` answers a few bytes; only its status is read.
HEALTHZ_MAX_BYTES = 64 * 1024


def gather_facts() -> DoctorFacts:
    gpus = {backend: probe_gpus(backend) for backend in GPU_BACKENDS}
    try:
        configs = load_gpu_configs()
        configs_problem = None
    except HarnessError as exc:
        configs, configs_problem = (), str(exc)
    build_tool = _tool("ninja") if shutil.which("ninja") else _tool("make")
    # The native build's own probe: it also finds nvcc off PATH (/usr/local/cuda/bin).
    cuda = find_cuda_toolkit()
    ccache_setting = os.environ.get(CCACHE_ENV, "")
    return DoctorFacts(
        python_version=".".join(str(p) for p in sys.version_info[:3]),
        python_executable=sys.executable,
        packages=tuple(_package(name, pins)
                       for pins in [read_constraints()] for name in KEY_PACKAGES),
        cmake=_tool("cmake"),
        compiler=Tool("c++", shutil.which("c++"),
                      compiler_version() if shutil.which("c++") else None),
        build_tool=build_tool,
        node=_tool("node"),
        allure=_allure(),
        docker=_docker(),
        devices=_devices(),
        cache=_cache(),
        store=_store(),
        service=_service(),
        gpu_compilers=MappingProxyType({
            backend: _nvcc(cuda) if backend is Backend.CUDA and cuda is not None
            else _tool(program) for backend, (program, _, _) in GPU_COMPILERS.items()}),
        cuda=cuda,
        gpus=MappingProxyType(gpus),
        gpu_configs=configs,
        gpu_configs_problem=configs_problem,
        ccache=_ccache(ccache_setting),
        ccache_setting=ccache_setting,
    )


def _ccache(setting: str) -> Tool:
    """The compiler cache ``HARNESS_CCACHE`` asks for; not run when it turns it off."""
    program = ccache_program(setting)
    return _tool(program) if program is not None else Tool(AUTO_PROGRAM)


def _package(name: str, pins: dict[str, str]) -> Package:
    try:
        version: str | None = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        version = None
    return Package(name, version, pins.get(normal_name(name)))


def _tool(program: str) -> Tool:
    """``program``'s path and the line of its ``--version`` that names the version: the
    first saying "version" or "release" (nvcc opens with a banner), else the first."""
    path = shutil.which(program)
    if path is None:
        return Tool(program)
    try:
        proc = subprocess.run([path, "--version"], capture_output=True, text=True,
                              timeout=_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return Tool(program, path)
    lines = [line.strip() for line in (proc.stdout or proc.stderr).splitlines() if line.strip()]
    if not lines:
        return Tool(program, path)
    named = [line for line in lines if re.search(r"\b(version|release)\b", line, re.I)]
    line = (named or lines)[0]
    return Tool(program, path, line if program in line.lower() else f"{program} {line}")


def _nvcc(cuda: CudaToolkit) -> Tool:
    return Tool("nvcc", cuda.nvcc, f"nvcc {cuda.version}")


def _allure() -> AllureFacts:
    try:
        command = allure_command()
    except HarnessError as exc:
        return AllureFacts(None, str(exc))
    return AllureFacts(installed_version(Path(command[-1])) or "?", path=command[-1])


def _docker() -> DockerFacts:
    try:
        client = docker_engine()
    except HarnessError as exc:
        return DockerFacts(problem=str(exc))
    try:
        version = str(client.version().get("Version", "?"))
        runtimes = tuple(sorted(client.info().get("Runtimes", {}) or {}))
    except Exception as exc:  # the SDK's errors: the engine answered ping, then failed
        return DockerFacts(problem=f"the Docker engine answers but `docker info` failed "
                                   f"({exc}); check the engine's log")
    finally:
        client.close()
    return DockerFacts(version=version, runtimes=runtimes)


def _devices() -> DeviceFacts:
    kfd = Path("/dev/kfd")
    dri = Path("/dev/dri")
    nodes = sorted(dri.glob("renderD*")) if dri.is_dir() else []
    user_groups = []
    for gid in os.getgroups():
        try:
            user_groups.append(grp.getgrgid(gid).gr_name)
        except KeyError:
            continue
    return DeviceFacts(
        kfd=kfd.exists(), kfd_openable=kfd.exists() and readable_and_writable(kfd),
        dri=dri.is_dir(), render_nodes=tuple(str(n) for n in nodes),
        dri_openable=any(readable_and_writable(n) for n in nodes),
        user=getpass.getuser(), is_root=os.geteuid() == 0,
        user_groups=tuple(user_groups),
        host_groups=tuple(g for g in GROUPS if host_group_id(g) is not None))


def _cache() -> CacheFacts:
    root = cache_root()
    existing = root
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    builds = []
    unreadable = []
    for record in sorted(builds_dir(root).glob("*/build.json")):
        try:
            info = read_build_info(record)
        except HarnessError as exc:
            unreadable.append(str(exc))
            continue
        builds.append(CachedBuild(info.key, info.backend, info.version))
    return CacheFacts(str(root), os.access(existing, os.W_OK), tuple(builds), tuple(unreadable))


def _store() -> StoreFacts:
    try:
        url = default_url()
    except OSError as exc:
        return StoreFacts("(default)", f"the harness cache cannot hold the store ({exc}); "
                                       "set HARNESS_CACHE or HARNESS_RESULTS_URL")
    try:
        open_store(url).close()
    except HarnessError as exc:
        return StoreFacts(display_url(url), str(exc))
    return StoreFacts(display_url(url))


def _service() -> ServiceFacts:
    url = os.environ.get(SERVICE_URL_ENV, "").strip().rstrip("/")
    if not url:
        return ServiceFacts()
    call = ServiceCall(url, "GET", "/healthz", _TIMEOUT_S, HEALTHZ_MAX_BYTES,
                       setting=SERVICE_URL_ENV)
    try:
        response = call.send(accept=None)
    except ServiceError as exc:
        return ServiceFacts(url, problem=exc.what)
    return ServiceFacts(url, status=response.status_code)
