"""The CMake flags and the build key (pure)."""

from __future__ import annotations

import pytest

from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest, build_argv, build_key


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


def test_key_is_stable_and_changes_with_each_input() -> None:
    base = build_key("src1", BuildRequest(), "gcc 12")
    assert base == build_key("src1", BuildRequest(), "gcc 12")
    assert base.startswith("cpu-")
    variants = {
        build_key("src2", BuildRequest(), "gcc 12"),
        build_key("src1", BuildRequest(native=True), "gcc 12"),
        build_key("src1", BuildRequest(backend=Backend.VULKAN), "gcc 12"),
        build_key("src1", BuildRequest(extra_cmake_args=("-DX=1",)), "gcc 12"),
        build_key("src1", BuildRequest(), "gcc 13"),
    }
    assert base not in variants
    assert len(variants) == 5
