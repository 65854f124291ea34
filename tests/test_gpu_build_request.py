"""GPU architectures, the reduced variant and the container recipe in the build key (pure)."""

from __future__ import annotations

import pytest

from harness.builds.container_build import container_recipe
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest, build_key
from harness.planning.container_plan import TOOLKIT_ARG, container_build_args


def test_archs_and_reduced_reach_the_flags_in_a_fixed_order() -> None:
    cuda = BuildRequest(backend=Backend.CUDA, gpu_archs=("89", "90"))
    assert cuda.cmake_flags()[-1] == "-DCMAKE_CUDA_ARCHITECTURES=89;90"
    reduced = BuildRequest(backend=Backend.CUDA, reduced=True)
    assert reduced.cmake_flags()[-2:] == ("-DCMAKE_CUDA_ARCHITECTURES=90", "-DGGML_CUDA_FA=OFF")
    rocm = BuildRequest(backend=Backend.ROCM, reduced=True, gpu_archs=("gfx942",))
    assert rocm.cmake_flags()[-2:] == ("-DGPU_TARGETS=gfx942", "-DGGML_CUDA_FA=OFF")
    assert "-DGPU_TARGETS=gfx1100" in BuildRequest(backend=Backend.ROCM,
                                                   reduced=True).cmake_flags()


def test_the_reduced_variant_is_named_in_the_key() -> None:
    full = build_key("d", BuildRequest(backend=Backend.CUDA, gpu_archs=("90",)), "c")
    reduced = build_key("d", BuildRequest(backend=Backend.CUDA, reduced=True), "c")
    assert full.startswith("cuda-")
    assert not full.startswith("cuda-reduced-")
    assert reduced.startswith("cuda-reduced-")


@pytest.mark.parametrize(("request_kwargs", "message"), [
    ({"backend": Backend.CPU, "reduced": True}, r"for the cuda and rocm backends, not cpu"),
    ({"backend": Backend.VULKAN, "gpu_archs": ("90",)}, r"not vulkan"),
    ({"backend": Backend.CUDA, "gpu_archs": ("sm_90",)}, r"'sm_90' is not a cuda GPU arch.*'90'"),
    ({"backend": Backend.ROCM, "gpu_archs": ("90",)}, r"'90' is not a rocm GPU arch.*gfx1100"),
    ({"backend": Backend.CUDA, "reduced": True, "gpu_archs": ("89", "90")},
     r"a reduced build compiles one GPU architecture; got 89, 90"),
])
def test_bad_architectures_are_refused_with_the_fix(request_kwargs: dict[str, object],
                                                    message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        BuildRequest(**request_kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("backend", [Backend.CUDA, Backend.ROCM], ids=str)
def test_the_toolkit_switch_says_where_the_gpu_toolkit_comes_from(backend: Backend) -> None:
    request = BuildRequest(backend=backend, reduced=True)
    assert container_build_args(backend, request, None)[TOOLKIT_ARG] == "base"
    local = container_build_args(backend, request, {"BUILD_BASE": "harness-base/debian:sid",
                                                    "RUNTIME_BASE": "harness-base/debian:sid"},
                                 local_base=True)
    assert local[TOOLKIT_ARG] == "debian"
    assert TOOLKIT_ARG not in container_build_args(Backend.CPU, BuildRequest(), None)


def test_the_container_recipe_hashes_the_dockerfile_every_arg_and_the_bases() -> None:
    args = {"CMAKE_FLAGS": "-DX=1", "AMDGPU_TARGETS": "gfx1100", "TOOLKIT": "debian"}
    recipe = container_recipe(b"FROM x\n", args, ["sha256:a", "sha256:b"])
    assert recipe == container_recipe(b"FROM x\n", dict(reversed(args.items())),
                                      ["sha256:a", "sha256:b"])
    changed = {container_recipe(b"FROM y\n", args, ["sha256:a", "sha256:b"]),
               container_recipe(b"FROM x\n", {**args, "AMDGPU_TARGETS": "gfx942"},
                                ["sha256:a", "sha256:b"]),
               container_recipe(b"FROM x\n", args, ["sha256:a", "sha256:c"])}
    assert recipe not in changed
    assert len(changed) == 3
