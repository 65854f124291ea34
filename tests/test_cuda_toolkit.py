"""Finding a CUDA toolkit for a native build, and configuring the pinned source with it.

The parsers are held to what the real tools print here (nvcc 13.0 at /usr/local/cuda, the
``nvidia-cublas`` wheel's file list, ``ldconfig -p``). The real test runs CMake's configure
step of the pinned source with ``-DGGML_CUDA=ON`` against this machine's nvcc and the
cuBLAS it finds, then compiles one CUDA object: a whole CUDA build takes about an hour on
two cores, the configure step seconds.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from harness.builds.native import NativeToolchain, configure_tree, native_toolchain
from harness.builds.resolve import resolve_source
from harness.errors import BuildError, ToolMissingError
from harness.facts.build import Backend
from harness.facts.cuda_toolkit import Cublas, CublasOrigin, CudaToolkit
from harness.paths import cache_root
from harness.planning.build_plan import NO_VMM_FLAG, BuildRequest
from harness.probes import cuda_toolkit
from harness.probes.cuda_toolkit import (
    find_cuda_toolkit,
    parse_cublas_header_version,
    parse_ldconfig_driver,
    parse_nvcc_top,
    parse_nvcc_version,
    require_cuda_toolkit,
    wheel_files,
)
from harness.probes.toolchain import Toolchain

#: ``/usr/local/cuda/bin/nvcc --version`` on this machine kind.
NVCC_VERSION = """nvcc: NVIDIA (R) Cuda compiler driver
Copyright (c) 2005-2025 NVIDIA Corporation
Built on Wed_Aug_20_01:58:59_PM_PDT_2025
Cuda compilation tools, release 13.0, V13.0.88
Build cuda_13.0.r13.0/compiler.36424714_0
"""
#: The head of ``nvcc -v __x`` (a dry run), through a wrapper in /usr/local/bin.
NVCC_DRY_RUN = """#$ _NVVM_BRANCH_=nvvm
#$ _SPACE_= \n#$ _CUDART_=cudart
#$ _HERE_=/usr/local/cuda-13.0/bin
#$ _THERE_=/usr/local/cuda-13.0/bin
#$ _TARGET_SIZE_=
#$ TOP=/usr/local/cuda-13.0/bin/..
"""
#: ``pip show -f nvidia-cublas`` (13.1.1.3, the cuBLAS of CUDA 13.0's cuda-toolkit 13.0.3).
WHEEL_FILES = [
    "nvidia/cu13/include/cublas.h",
    "nvidia/cu13/include/cublasLt.h",
    "nvidia/cu13/include/cublasXt.h",
    "nvidia/cu13/include/cublas_api.h",
    "nvidia/cu13/include/cublas_v2.h",
    "nvidia/cu13/include/nvblas.h",
    "nvidia/cu13/lib/libcublas.so.13",
    "nvidia/cu13/lib/libcublasLt.so.13",
    "nvidia/cu13/lib/libnvblas.so.13",
    "nvidia_cublas-13.1.1.3.dist-info/METADATA",
    "nvidia_cublas-13.1.1.3.dist-info/RECORD",
]
CUBLAS_API_H = """#define CUBLAS_VER_MAJOR 13
#define CUBLAS_VER_MINOR 1
#define CUBLAS_VER_PATCH 1
#define CUBLAS_VER_BUILD 3
#define CUBLAS_VERSION (CUBLAS_VER_MAJOR * 10000 + CUBLAS_VER_MINOR * 100 + CUBLAS_VER_PATCH)
"""
LDCONFIG = """1234 libs found in cache `/etc/ld.so.cache'
	libcupti.so.13 (libc6,x86-64) => /usr/local/cuda-13.0/lib/libcupti.so.13
	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
	libcuda.so.1 (libc6) => /usr/lib/i386-linux-gnu/libcuda.so.1
"""


def test_nvcc_version_and_root_are_read_as_cmake_reads_them() -> None:
    assert parse_nvcc_version(NVCC_VERSION) == "13.0.88"
    assert parse_nvcc_version("nvcc: command not found") is None
    # The wrapper on PATH is not the toolkit: its dry run names the real one.
    assert parse_nvcc_top(NVCC_DRY_RUN) == "/usr/local/cuda-13.0"
    assert parse_nvcc_top("") is None


def test_the_wheel_layout_and_header_version_are_found() -> None:
    assert wheel_files(WHEEL_FILES) == ("nvidia/cu13/include", "nvidia/cu13/lib/libcublas.so.13",
                                        "nvidia/cu13/lib/libcublasLt.so.13")
    assert wheel_files([f for f in WHEEL_FILES if "cublasLt" not in f]) is None
    assert parse_cublas_header_version(CUBLAS_API_H) == "13.1.1.3"
    assert parse_cublas_header_version("#define CUBLAS_VER_MAJOR 13\n") is None


def test_ldconfig_gives_the_64_bit_driver_library() -> None:
    assert parse_ldconfig_driver(LDCONFIG) == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
    assert parse_ldconfig_driver(LDCONFIG.replace("libcuda.so.1 (libc6,x86-64)", "x")) is None


def test_no_nvcc_is_an_error_naming_it_and_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_toolkit, "find_nvcc", lambda: None)
    with pytest.raises(ToolMissingError) as caught:
        require_cuda_toolkit()
    assert "(nvcc)" in str(caught.value)
    assert "/usr/local/cuda/bin/nvcc" in str(caught.value)
    assert "apt-get install nvidia-cuda-toolkit" in str(caught.value)


def test_a_cuda_build_names_nvcc_and_cublas_in_its_key_and_passes_their_flags() -> None:
    tools = Toolchain(cmake="/usr/bin/cmake", generator="Ninja", compiler="g++ 12.2.0")
    cublas = Cublas(CublasOrigin.WHEEL, "13.1.1.3", "/venv/nvidia/cu13/include",
                    "/venv/nvidia/cu13/lib/libcublas.so.13",
                    "/venv/nvidia/cu13/lib/libcublasLt.so.13", "nvidia-cublas")
    toolkit = CudaToolkit("/usr/local/cuda/bin/nvcc", "13.0.88", "/usr/local/cuda", cublas)
    request = BuildRequest(backend=Backend.CUDA, extra_cmake_args=(NO_VMM_FLAG,))
    native = native_toolchain(request, tools, toolkit)
    assert native.compiler.startswith("g++ 12.2.0; nvcc 13.0.88")
    assert "cuBLAS 13.1.1.3 from the nvidia-cublas wheel (/venv/nvidia/cu13/lib)" \
        in native.compiler
    assert "-DCUDA_cublas_LIBRARY=/venv/nvidia/cu13/lib/libcublas.so.13" in native.flags
    # Another backend needs no toolkit and names only the C++ compiler.
    assert native_toolchain(BuildRequest(), tools) == NativeToolchain(tools, (), "g++ 12.2.0")


# --- the real configure step ----------------------------------------------------------


@pytest.fixture(scope="module")
def toolkit() -> CudaToolkit:
    if not Path("/usr/local/cuda/bin/nvcc").exists():
        pytest.skip("no CUDA toolkit at /usr/local/cuda (this test configures against it)")
    found = find_cuda_toolkit()
    assert found is not None, "nvcc is at /usr/local/cuda/bin but its version is unreadable"
    if found.cublas is None:
        pytest.skip(f"no cuBLAS: {found.cublas_problem} (`pip install nvidia-cublas`)")
    return found


@pytest.mark.timeout(300)
def test_cmake_configures_the_pinned_source_for_cuda_and_compiles_a_cuda_object(
        toolkit: CudaToolkit, tmp_path: Path) -> None:
    # Without a libcuda to link (no driver, no stub: a GPU-less build host), ggml-cuda's VMM
    # pool is left out, as the error for that case tells the user to do.
    extra = () if toolkit.driver is not None else (NO_VMM_FLAG,)
    request = BuildRequest(backend=Backend.CUDA, gpu_archs=("90",), extra_cmake_args=extra)
    tools = native_toolchain(request)
    tree = tmp_path / "tree"
    try:
        configure_tree(tree, resolve_source(cache_root(), None), request, tools,
                       tmp_path / "configure.log")
    except BuildError as exc:
        pytest.fail(str(exc))
    cache = (tree / "CMakeCache.txt").read_text()
    assert f"CMAKE_CUDA_COMPILER:STRING={toolkit.nvcc}\n" in cache
    assert "GGML_CUDA:BOOL=ON" in cache
    assert toolkit.cublas is not None
    assert f"CUDA_cublas_LIBRARY:FILEPATH={toolkit.cublas.library}" in cache
    log = (tmp_path / "configure.log").read_text()
    assert f"The CUDA compiler identification is NVIDIA {toolkit.version}" in log
    assert "Using CMAKE_CUDA_ARCHITECTURES=90 " in log
    if tools.toolchain.generator != "Ninja" or shutil.which("ninja") is None:
        return
    # One small kernel file: it includes common.cuh, so cuBLAS's headers too.
    obj = "ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir/clamp.cu.o"
    done = subprocess.run(["ninja", "-C", str(tree), "-j1", obj], capture_output=True,
                          text=True, timeout=240, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert (tree / obj).stat().st_size > 0
