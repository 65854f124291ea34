"""The CMake flags and the build key (pure)."""

from __future__ import annotations

import dataclasses

import pytest

from harness.errors import ToolMissingError
from harness.facts.build import Backend
from harness.facts.cuda_toolkit import (
    Cublas,
    CublasOrigin,
    CudaToolkit,
    DriverLibrary,
    DriverLibraryOrigin,
)
from harness.planning.build_plan import (
    NO_VMM_FLAG,
    BuildRequest,
    build_argv,
    build_key,
    configure_argv,
    cublas_fix,
    cuda_toolkit_flags,
    rpc_server_target,
    wants_rpc_server,
)


def test_default_build_is_portable_release_server_only() -> None:
    flags = BuildRequest().cmake_flags()
    for expected in ("-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_BUILD_TESTS=OFF",
                     "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_OPENSSL=OFF",
                     "-DLLAMA_USE_PREBUILT_UI=OFF", "-DGGML_NATIVE=OFF"):
        assert expected in flags
    assert not any(flag.startswith(("-DGGML_CUDA", "-DGGML_HIP", "-DGGML_VULKAN"))
                   for flag in flags)


def test_native_turns_ggml_native_on() -> None:
    assert "-DGGML_NATIVE=ON" in BuildRequest(native=True).cmake_flags()


@pytest.mark.parametrize(("backend", "switch"), [
    (Backend.CUDA, "-DGGML_CUDA=ON"), (Backend.ROCM, "-DGGML_HIP=ON"),
    (Backend.VULKAN, "-DGGML_VULKAN=ON"),
])
def test_gpu_backends_switch_their_ggml_option(backend: Backend, switch: str) -> None:
    assert switch in BuildRequest(backend=backend).cmake_flags()


def test_extra_flags_come_last() -> None:
    flags = BuildRequest(extra_cmake_args=("-DGGML_AVX512=ON",)).cmake_flags()
    assert flags[-1] == "-DGGML_AVX512=ON"


def test_build_argv_builds_only_the_server_target() -> None:
    assert build_argv("cmake", "/b", 2) == ["cmake", "--build", "/b", "--target",
                                            "llama-server", "--parallel", "2"]


def test_rpc_adds_ggmls_switch_and_its_server_target() -> None:
    flags = BuildRequest(rpc=True).cmake_flags()
    assert "-DGGML_RPC=ON" in flags
    assert wants_rpc_server(flags)
    assert not wants_rpc_server(BuildRequest().cmake_flags())
    # The last switch wins, as in CMake: a user's -DGGML_RPC=OFF after --rpc turns it off.
    assert not wants_rpc_server((*flags, "-DGGML_RPC=OFF"))
    assert build_argv("cmake", "/b", 2, ("llama-server", "ggml-rpc-server"))[3:6] == [
        "--target", "llama-server", "ggml-rpc-server"]


@pytest.mark.parametrize(("cmake_lists", "target"), [
    ("set(TARGET ggml-rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)", "ggml-rpc-server"),
    ("set(TARGET rpc-server)\nadd_executable(${TARGET} rpc-server.cpp)", "rpc-server"),
    ("add_executable(something)", "ggml-rpc-server"),
])
def test_the_rpc_servers_target_is_read_from_the_tree(cmake_lists: str, target: str) -> None:
    assert rpc_server_target(cmake_lists) == target


def test_key_is_stable_and_changes_with_each_input() -> None:
    base = build_key("src1", BuildRequest(), "gcc 12")
    assert base == build_key("src1", BuildRequest(), "gcc 12")
    assert base.startswith("cpu-")
    variants = {
        build_key("src2", BuildRequest(), "gcc 12"),
        build_key("src1", BuildRequest(native=True), "gcc 12"),
        build_key("src1", BuildRequest(backend=Backend.VULKAN), "gcc 12"),
        build_key("src1", BuildRequest(extra_cmake_args=("-DX=1",)), "gcc 12"),
        build_key("src1", BuildRequest(rpc=True), "gcc 12"),
        build_key("src1", BuildRequest(), "gcc 13"),
    }
    assert base not in variants
    assert len(variants) == 6


# --- a native CUDA build: where this host's toolkit is ---------------------------------

_WHEEL_CUBLAS = Cublas(CublasOrigin.WHEEL, "13.1.1.3", "/venv/nvidia/cu13/include",
                       "/venv/nvidia/cu13/lib/libcublas.so.13",
                       "/venv/nvidia/cu13/lib/libcublasLt.so.13", "nvidia-cublas")
_DRIVER = DriverLibrary(DriverLibraryOrigin.DRIVER, "/usr/lib/x86_64-linux-gnu/libcuda.so.1")


def _toolkit(**changes: object) -> CudaToolkit:
    toolkit = CudaToolkit("/usr/local/cuda-13.0/bin/nvcc", "13.0.88", "/usr/local/cuda-13.0",
                          _WHEEL_CUBLAS, _DRIVER)
    return dataclasses.replace(toolkit, **changes)  # type: ignore[arg-type]


def _values(flags: tuple[str, ...]) -> dict[str, str]:
    return dict(flag.removeprefix("-D").split("=", 1) for flag in flags)


def test_a_wheel_cublas_and_a_driver_libcuda_are_handed_to_find_cuda_toolkit() -> None:
    flags = _values(cuda_toolkit_flags(_toolkit(), BuildRequest(backend=Backend.CUDA)))
    assert flags == {
        "CMAKE_CUDA_COMPILER": "/usr/local/cuda-13.0/bin/nvcc",
        "CUDAToolkit_ROOT": "/usr/local/cuda-13.0",
        "CUDA_cublas_LIBRARY": _WHEEL_CUBLAS.library,
        "CUDA_cublasLt_LIBRARY": _WHEEL_CUBLAS.lt_library,
        "CMAKE_CUDA_STANDARD_INCLUDE_DIRECTORIES": _WHEEL_CUBLAS.include_dir,
        "CUDA_cuda_driver_LIBRARY": _DRIVER.path,
    }


def test_the_toolkits_own_cublas_and_stub_are_left_to_cmake_to_find() -> None:
    own = dataclasses.replace(_WHEEL_CUBLAS, origin=CublasOrigin.TOOLKIT, distribution=None)
    stub = DriverLibrary(DriverLibraryOrigin.STUB, "/usr/local/cuda/lib64/stubs/libcuda.so")
    flags = _values(cuda_toolkit_flags(_toolkit(cublas=own, driver=stub),
                                       BuildRequest(backend=Backend.CUDA)))
    assert set(flags) == {"CMAKE_CUDA_COMPILER", "CUDAToolkit_ROOT"}


def test_no_cublas_is_an_error_with_the_wheel_to_install() -> None:
    missing = _toolkit(cublas=None, cublas_problem="no cublas_v2.h under /usr/local/cuda")
    with pytest.raises(ToolMissingError) as caught:
        cuda_toolkit_flags(missing, BuildRequest(backend=Backend.CUDA))
    assert "cuBLAS is not found for nvcc 13.0.88" in str(caught.value)
    assert "no cublas_v2.h under /usr/local/cuda" in str(caught.value)
    assert "`pip install nvidia-cublas`" in str(caught.value)
    assert "nvidia-cublas-cu12" in cublas_fix(12)


def test_no_libcuda_is_an_error_unless_the_vmm_pool_is_off() -> None:
    bare = _toolkit(driver=None)
    with pytest.raises(ToolMissingError) as caught:
        cuda_toolkit_flags(bare, BuildRequest(backend=Backend.CUDA))
    assert "libcuda.so is not found" in str(caught.value)
    assert f"--cmake-arg {NO_VMM_FLAG}" in str(caught.value)
    no_vmm = BuildRequest(backend=Backend.CUDA, extra_cmake_args=(NO_VMM_FLAG,))
    assert "CUDA_cuda_driver_LIBRARY" not in _values(cuda_toolkit_flags(bare, no_vmm))


def test_a_cmake_arg_wins_over_the_discovered_toolkit() -> None:
    request = BuildRequest(backend=Backend.CUDA, gpu_archs=("90",),
                           extra_cmake_args=("-DCMAKE_CUDA_COMPILER=/opt/cuda-12.8/bin/nvcc",))
    argv = configure_argv("cmake", "/src", "/tree", "Ninja", request,
                          toolchain_flags=cuda_toolkit_flags(_toolkit(), request))
    compilers = [a for a in argv if a.startswith("-DCMAKE_CUDA_COMPILER=")]
    # CMake keeps the last -D of a name: the user's.
    assert compilers[-1] == "-DCMAKE_CUDA_COMPILER=/opt/cuda-12.8/bin/nvcc"
    assert "-DCMAKE_CUDA_ARCHITECTURES=90" in argv


def test_the_cuda_toolkit_is_part_of_the_key() -> None:
    request = BuildRequest(backend=Backend.CUDA, gpu_archs=("90",))
    keys = {build_key("src", request, f"g++ 12; {tk.describe()}") for tk in (
        _toolkit(), _toolkit(version="13.1.40"),
        _toolkit(cublas=dataclasses.replace(_WHEEL_CUBLAS, version="13.2.0.9")),
        _toolkit(cublas=dataclasses.replace(_WHEEL_CUBLAS,
                                            library="/other-venv/libcublas.so.13")))}
    assert len(keys) == 4
    assert build_key("src", BuildRequest(backend=Backend.CUDA, gpu_archs=("89",)),
                     f"g++ 12; {_toolkit().describe()}") not in keys
