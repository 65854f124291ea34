"""The ``docker build`` arguments for a container build of llama-server (pure).

The Dockerfiles in ``ci/docker/`` take their CMake flags from one build argument,
``CMAKE_FLAGS``, and have no default for it: the flags come from the same
``BuildRequest.cmake_flags()`` the native build runs, so a container build and a native
build of one request cannot drift apart. The base images are build arguments too, so a
runner without registry access passes images it made itself (``debootstrap`` and
``docker import``, see docs/design.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest

#: The build argument that carries the CMake flags, space separated.
CMAKE_FLAGS_ARG = "CMAKE_FLAGS"
#: The build arguments naming the images of the build and the runtime stage.
IMAGE_ARGS: tuple[str, ...] = ("BUILD_BASE", "RUNTIME_BASE")
#: Where every image keeps the server; it is also the image's ENTRYPOINT.
SERVER_PATH_IN_IMAGE = "/app/llama-server"

#: Debian 13: the Vulkan backend needs its Vulkan headers (Debian 12's 1.3.239 lacks
#: ``vk::LayerSettingEXT``, docs/design.md), and one locally made trixie base then serves
#: both the CPU and the Vulkan image.
_DEBIAN = "debian:trixie-slim"
#: The versions llama.cpp's own .devops/cuda.Dockerfile and rocm.Dockerfile use.
_CUDA = "nvidia/cuda:12.8.1-{flavour}-ubuntu24.04"
#: ROCm has no slim runtime image holding rocBLAS/hipBLAS and their kernel files, so
#: llama.cpp runs from the dev image too; the harness follows.
_ROCM = "rocm/dev-ubuntu-24.04:7.2.1-complete"

#: The images each Dockerfile defaults to: what a GPU runner with registry access uses.
#: ``tests/test_dockerfiles.py`` checks that the Dockerfiles' ARG defaults equal these.
DEFAULT_BASES: Mapping[Backend, Mapping[str, str]] = MappingProxyType({
    Backend.CPU: MappingProxyType({"BUILD_BASE": _DEBIAN, "RUNTIME_BASE": _DEBIAN}),
    Backend.CUDA: MappingProxyType({"BUILD_BASE": _CUDA.format(flavour="devel"),
                                    "RUNTIME_BASE": _CUDA.format(flavour="runtime")}),
    Backend.ROCM: MappingProxyType({"BUILD_BASE": _ROCM, "RUNTIME_BASE": _ROCM}),
    Backend.VULKAN: MappingProxyType({"BUILD_BASE": _DEBIAN, "RUNTIME_BASE": _DEBIAN}),
})


#: Where the CUDA image keeps the toolkit's driver stub (ci/docker/cuda.Dockerfile): off
#: the loader's path, so only a container told so loads it.
CUDA_DRIVER_STUB_DIR = "/opt/harness/cuda-stub"
#: The environment a build's ``--version``/``--help`` are asked in, where the build machine
#: has no GPU: the CUDA binary links libcuda.so.1 and would not load at all without one.
#: Never used for a server that is to reach a GPU: the stub would shadow the driver.
PROBE_ENVIRONMENT: Mapping[Backend, Mapping[str, str]] = MappingProxyType({
    Backend.CUDA: MappingProxyType({"LD_LIBRARY_PATH": CUDA_DRIVER_STUB_DIR}),
})

#: The build argument of the CUDA and ROCm Dockerfiles that says where the GPU toolkit
#: comes from: ``base`` (NVIDIA's / AMD's images carry it) or ``debian`` (a local Debian
#: base: the Dockerfile installs Debian's packages of it).
TOOLKIT_ARG = "TOOLKIT"
#: Which Dockerfiles have that switch.
TOOLKIT_BACKENDS = (Backend.CUDA, Backend.ROCM)


@dataclass(frozen=True)
class LocalBase:
    """The local Debian base (``harness base-image``) an image builds from when the
    Dockerfile's registry bases cannot be pulled."""

    distro: str
    components: tuple[str, ...] = ("main",)


#: CPU and Vulkan: Debian 13 (see ``_DEBIAN``). CUDA: trixie's ``non-free`` has
#: nvidia-cuda-toolkit 12.4 and cuda-g++ (g++ 13; trixie's g++ 14 is too new for nvcc
#: 12.4). ROCm: ggml-hip refuses HIP < 6.1, trixie has 5.7, sid has 6.4 (docs/design.md).
LOCAL_BASES: Mapping[Backend, LocalBase] = MappingProxyType({
    Backend.CPU: LocalBase("debian:13"),
    Backend.VULKAN: LocalBase("debian:13"),
    Backend.CUDA: LocalBase("debian:13", ("main", "contrib", "non-free")),
    Backend.ROCM: LocalBase("debian:sid"),
})


def container_build_args(backend: Backend, request: BuildRequest,
                         bases: Mapping[str, str] | None, *,
                         local_base: bool = False) -> dict[str, str]:
    """The build args for ``ci/docker/<backend>.Dockerfile``: images and CMake flags.

    ``bases`` overrides ``BUILD_BASE`` and/or ``RUNTIME_BASE`` (for example with locally
    made images); every image arg is passed explicitly, so the returned dict alone says
    what the image is built from. A :class:`ConfigError` names an unknown key, a flag the
    build argument cannot carry, or a request the container build cannot honour.
    """
    if request.backend is not backend:
        raise ConfigError(f"the build request is for backend {request.backend.value!r} but "
                          f"the container build is for {backend.value!r}; build the "
                          f"{request.backend.value} Dockerfile or change the request")
    overrides = dict(bases or {})
    unknown = sorted(set(overrides) - set(IMAGE_ARGS))
    if unknown:
        raise ConfigError(f"unknown base image argument {unknown[0]!r}; allowed: "
                          f"{', '.join(IMAGE_ARGS)} (CMake flags come from the build "
                          "request, not from here)")
    for name, image in overrides.items():
        if not image.strip() or any(char.isspace() for char in image):
            raise ConfigError(f"base image argument {name} is {image!r}; give an image "
                              "reference such as debian:trixie-slim")
    flags = request.cmake_flags()
    _check_native_gpu_archs(backend, request, flags)
    for flag in flags:
        # The Dockerfile expands CMAKE_FLAGS unquoted, so the shell splits it on
        # whitespace: a flag holding a space would reach cmake as two arguments.
        if not flag or any(char.isspace() for char in flag):
            raise ConfigError(f"CMake flag {flag!r} is empty or holds whitespace, which the "
                              f"{CMAKE_FLAGS_ARG} build argument cannot carry; write it "
                              "without spaces (CMake lists use ';')")
    args = {**DEFAULT_BASES[backend], **overrides}
    args[CMAKE_FLAGS_ARG] = " ".join(flags)
    if backend in TOOLKIT_BACKENDS:
        args[TOOLKIT_ARG] = "debian" if local_base else "base"
    elif local_base and backend not in LOCAL_BASES:
        raise ConfigError(f"no local base is known for the {backend.value} image")
    return args


def cmake_flags_from_build_arg(value: str) -> tuple[str, ...]:
    """The cmake arguments one ``CMAKE_FLAGS`` value becomes (the shell's field split)."""
    return tuple(value.split())


def build_arg_argv(build_args: Mapping[str, str]) -> list[str]:
    """``--build-arg NAME=VALUE`` pairs for the docker CLI, in a stable (sorted) order."""
    argv: list[str] = []
    for name in sorted(build_args):
        argv += ["--build-arg", f"{name}={build_args[name]}"]
    return argv


def _check_native_gpu_archs(backend: Backend, request: BuildRequest,
                            flags: tuple[str, ...]) -> None:
    # GGML_NATIVE=ON makes ggml-cuda compile for CMAKE_CUDA_ARCHITECTURES=native, the
    # GPUs present at build time; `docker build` gives the build no GPU, so the request
    # must name the architectures itself.
    if backend is Backend.CUDA and request.native and not any(
            "CMAKE_CUDA_ARCHITECTURES=" in flag for flag in flags):
        raise ConfigError("a native CUDA build in a container has no GPU to detect "
                          "(docker build sees none); add "
                          "--cmake-arg -DCMAKE_CUDA_ARCHITECTURES=<arch, e.g. 89> or drop "
                          "--native")
