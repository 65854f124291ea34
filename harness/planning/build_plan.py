"""The CMake invocation for a llama-server build, and the key that caches it (pure)."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

from harness.errors import ConfigError, ToolMissingError
from harness.facts.build import Backend
from harness.facts.cuda_toolkit import CublasOrigin, CudaToolkit, DriverLibraryOrigin

#: ggml's switch per backend (ggml/CMakeLists.txt options).
_BACKEND_SWITCH: dict[Backend, str | None] = {
    Backend.CPU: None,
    Backend.CUDA: "GGML_CUDA",
    Backend.ROCM: "GGML_HIP",
    Backend.VULKAN: "GGML_VULKAN",
}

#: Flags every build shares. Only the server target is built, with nothing that reaches
#: the network at configure time (the prebuilt web UI is downloaded by default) and no
#: TLS, and static libraries so the binary can be copied out of its build tree.
BASE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
)

#: Where each GPU backend takes its architecture list from: ggml-cuda reads CMake's
#: ``CMAKE_CUDA_ARCHITECTURES``; ggml-hip forwards ``GPU_TARGETS`` to
#: ``CMAKE_HIP_ARCHITECTURES`` (ggml/src/ggml-hip/CMakeLists.txt).
_ARCH_FLAG: dict[Backend, str] = {
    Backend.CUDA: "CMAKE_CUDA_ARCHITECTURES",
    Backend.ROCM: "GPU_TARGETS",
}
#: What one architecture looks like: CUDA compute capabilities (``90``, ``90a``,
#: ``120f``) and AMD gfx names with optional target features (``gfx90a:xnack-``).
_ARCH_PATTERN: dict[Backend, re.Pattern[str]] = {
    Backend.CUDA: re.compile(r"^\d{2,3}[af]?$"),
    Backend.ROCM: re.compile(r"^gfx[0-9a-f]{3,4}(:[a-z]+[+-])*$"),
}
#: The one architecture a reduced build compiles when none is named: sm_90 is the H200
#: of the device check and the newest Debian's CUDA 12.4 covers; gfx1100 (RX 7900 XTX)
#: is one of the cards in configs/gpu and in the list Debian's rocBLAS ships kernels for.
REDUCED_DEFAULT_ARCH: dict[Backend, str] = {Backend.CUDA: "90", Backend.ROCM: "gfx1100"}

SERVER_TARGET = "llama-server"
#: The RPC server's CMake target at the pin (tools/rpc/CMakeLists.txt); releases before
#: its rename call it ``rpc-server``, read from the tree by :func:`rpc_server_target`.
RPC_SERVER_TARGET = "ggml-rpc-server"
#: ggml's switch for the RPC backend: each ``rpc-server`` a llama-server is pointed at
#: (``--rpc HOST:PORT,...``) is one more device to it.
RPC_SWITCH = "-DGGML_RPC=ON"
#: Bumped when the layout of a build directory changes, so old caches are not reused.
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked for: a backend, native CPU tuning or not, the GPU
    architectures, the reduced variant or not, the RPC backend or not, extra CMake flags.

    ``gpu_archs`` are CUDA compute capabilities for CUDA and gfx targets for ROCm; empty
    means the toolchain's default (ggml's portable CUDA list; on ROCm the GPUs present,
    or the Dockerfile's list in a container). ``reduced`` is the variant CI builds to
    prove the backend compiles and starts: one architecture and no FlashAttention
    kernels (``GGML_CUDA_FA=OFF``: over half the CUDA objects of a default build).
    """

    backend: Backend = Backend.CPU
    native: bool = False
    extra_cmake_args: tuple[str, ...] = ()
    gpu_archs: tuple[str, ...] = ()
    reduced: bool = False
    #: Add ggml's RPC backend and build its RPC server beside llama-server.
    rpc: bool = False

    def __post_init__(self) -> None:
        if (self.gpu_archs or self.reduced) and self.backend not in _ARCH_FLAG:
            raise ConfigError(f"GPU architectures and the reduced variant are for the cuda "
                              f"and rocm backends, not {self.backend.value}; drop "
                              "--cuda-arch/--amdgpu-targets/--reduced")
        pattern = _ARCH_PATTERN.get(self.backend)
        for arch in self.gpu_archs:
            if pattern is not None and not pattern.match(arch):
                example = REDUCED_DEFAULT_ARCH[self.backend]
                raise ConfigError(f"{arch!r} is not a {self.backend.value} GPU architecture; "
                                  f"give names like {example!r}, comma separated")
        if self.reduced and len(self.gpu_archs) > 1:
            raise ConfigError("a reduced build compiles one GPU architecture; got "
                              f"{', '.join(self.gpu_archs)}: name one, or drop --reduced")

    @property
    def variant(self) -> str:
        """``reduced`` or ``full``: named in the build key and the reports."""
        return "reduced" if self.reduced else "full"

    def effective_archs(self) -> tuple[str, ...]:
        if self.reduced and not self.gpu_archs:
            return (REDUCED_DEFAULT_ARCH[self.backend],)
        return self.gpu_archs

    def cmake_flags(self) -> tuple[str, ...]:
        """The ``-D`` flags, in a fixed order (the order is part of the build key)."""
        # GGML_NATIVE is off by default so a binary built here runs on any x86-64 CPU
        # of the runner fleet, not only on the one that compiled it.
        flags = [*BASE_FLAGS, f"-DGGML_NATIVE={'ON' if self.native else 'OFF'}"]
        switch = _BACKEND_SWITCH[self.backend]
        if switch:
            flags.append(f"-D{switch}=ON")
        if archs := self.effective_archs():
            flags.append(f"-D{_ARCH_FLAG[self.backend]}={';'.join(archs)}")
        if self.reduced:
            # ggml-hip compiles ggml-cuda's sources, so the one switch serves both.
            flags.append("-DGGML_CUDA_FA=OFF")
        if self.rpc:
            flags.append(RPC_SWITCH)
        flags.extend(self.extra_cmake_args)
        return tuple(flags)


def build_key(source_digest: str, request: BuildRequest, compiler: str) -> str:
    """Content address of a build: same source, backend, flags and compiler → same key."""
    payload = json.dumps(
        {
            "layout": LAYOUT_VERSION,
            "source": source_digest,
            "backend": request.backend.value,
            "flags": list(request.cmake_flags()),
            "compiler": compiler,
        },
        sort_keys=True,
    )
    variant = "-reduced" if request.reduced else ""
    digest = hashlib.sha256(payload.encode()).hexdigest()[:16]
    return f"{request.backend.value}{variant}-{digest}"


def configure_argv(cmake: str, source: str, build_dir: str, generator: str,
                   request: BuildRequest, *,
                   toolchain_flags: tuple[str, ...] = ()) -> list[str]:
    """The configure command. ``toolchain_flags`` (where this host's toolkit is) come
    before the request's flags, so a ``--cmake-arg`` naming the same variable wins."""
    return [cmake, "-S", source, "-B", build_dir, "-G", generator, *toolchain_flags,
            *request.cmake_flags()]


#: ggml-cuda links ``CUDA::cuda_driver`` (libcuda) unless its VMM pool is off
#: (ggml/src/ggml-cuda/CMakeLists.txt: ``if (GGML_CUDA_NO_VMM)``).
NO_VMM_FLAG = "-DGGML_CUDA_NO_VMM=ON"


def cuda_toolkit_flags(toolkit: CudaToolkit, request: BuildRequest) -> tuple[str, ...]:
    """The CMake cache entries that point ggml-cuda's ``find_package(CUDAToolkit)`` at this
    host's nvcc, cuBLAS and libcuda (pure).

    FindCUDAToolkit takes the toolkit from nvcc (``CMAKE_CUDA_COMPILER``,
    ``CUDAToolkit_ROOT``) and looks for each library in it; a cache entry it finds already
    set (``CUDA_<lib>_LIBRARY``) is used as it is. So a wheel's cuBLAS is given as those
    entries plus its header directory as a standard include directory of CUDA sources
    (``CMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES``: only ``.cu`` files include
    ``cublas_v2.h``), and a driver's ``libcuda.so.1`` (which ``find_library`` does not
    take, wanting ``libcuda.so``) as ``CUDA_cuda_driver_LIBRARY``.
    """
    if toolkit.cublas is None:
        raise ToolMissingError(
            f"cuBLAS is not found for nvcc {toolkit.version} ({toolkit.nvcc}): "
            f"{toolkit.cublas_problem or 'not in the toolkit'}; install it with "
            f"{cublas_fix(toolkit.major)} and build again")
    flags = [f"-DCMAKE_CUDA_COMPILER={toolkit.nvcc}", f"-DCUDAToolkit_ROOT={toolkit.root}"]
    cublas = toolkit.cublas
    if cublas.origin is CublasOrigin.WHEEL:
        flags += [f"-DCUDA_cublas_LIBRARY={cublas.library}",
                  f"-DCUDA_cublasLt_LIBRARY={cublas.lt_library}",
                  f"-DCMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES={cublas.include_dir}"]
    if NO_VMM_FLAG in request.cmake_flags():
        return tuple(flags)
    if toolkit.driver is None:
        raise ToolMissingError(
            f"libcuda.so is not found (neither the toolkit's lib64/stubs/libcuda.so under "
            f"{toolkit.root} nor an NVIDIA driver's libcuda.so.1): ggml-cuda links it for "
            "its VMM memory pool; install the NVIDIA driver (or a toolkit with its stubs), "
            f"or build without the pool with --cmake-arg {NO_VMM_FLAG}")
    if toolkit.driver.origin is DriverLibraryOrigin.DRIVER:
        flags.append(f"-DCUDA_cuda_driver_LIBRARY={toolkit.driver.path}")
    return tuple(flags)


def cublas_wheel_name(cuda_major: int) -> str:
    """The PyPI distribution carrying cuBLAS for a CUDA major version: from CUDA 13 on
    NVIDIA publishes ``nvidia-cublas`` (``nvidia-cublas-cu13`` is a deprecated alias);
    before, one package per major (``nvidia-cublas-cu12``)."""
    return "nvidia-cublas" if cuda_major >= 13 else f"nvidia-cublas-cu{cuda_major}"


#: The build the suites run when none is named (the main job, ``pytest suites``): the
#: pinned CPU build with the RPC backend and its server, so that the multi-device suite
#: spreads a model over real RPC devices on every machine. Without ``--rpc`` in a launch
#: the backend adds no device and changes nothing the other suites see.
SUITE_BUILD = BuildRequest(rpc=True)


def cublas_fix(cuda_major: int) -> str:
    """How to get cuBLAS for a CUDA major version, as an error or doctor row says it."""
    wheel = cublas_wheel_name(cuda_major)
    return (f"`pip install {wheel}` into the harness's environment (`.venv/bin/python -m "
            f"pip install {wheel}`), or the toolkit's own cuBLAS")


def build_argv(cmake: str, build_dir: str, jobs: int,
               targets: tuple[str, ...] = (SERVER_TARGET,)) -> list[str]:
    return [cmake, "--build", build_dir, "--target", *targets, "--parallel", str(jobs)]


def wants_rpc_server(cmake_flags: tuple[str, ...]) -> bool:
    """Whether a build with these flags has the RPC backend (the last switch wins)."""
    switches = [f for f in cmake_flags if f.startswith("-DGGML_RPC=")]
    return bool(switches) and switches[-1].split("=", 1)[1].upper() in {"ON", "1", "TRUE"}


_TARGET_LINE = re.compile(r"set\(\s*TARGET\s+([\w-]+)\s*\)")


def rpc_server_target(cmake_lists: str) -> str:
    """The RPC server's target named in its ``CMakeLists.txt`` text (``ggml-rpc-server`` at
    the pin, ``rpc-server`` in older trees); the pin's name when the text names none."""
    match = _TARGET_LINE.search(cmake_lists)
    return match.group(1) if match else RPC_SERVER_TARGET
