"""Finds the build tools a native llama-server build needs, with install hints."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from harness.errors import ToolMissingError
from harness.facts.build import Backend

#: (program, Debian package that provides it, what it is for)
_REQUIRED: tuple[tuple[str, str, str], ...] = (
    ("cmake", "cmake", "CMake"),
    ("cc", "gcc", "a C compiler"),
    ("c++", "g++", "a C++ compiler"),
)
#: Extra compilers each GPU backend needs on the build host.
_BACKEND_TOOLS: dict[Backend, tuple[str, str, str]] = {
    Backend.CUDA: ("nvcc", "nvidia-cuda-toolkit", "the CUDA compiler"),
    Backend.ROCM: ("hipcc", "hipcc", "the HIP compiler"),
    Backend.VULKAN: ("glslc", "glslc", "the GLSL shader compiler"),
}


@dataclass(frozen=True)
class Toolchain:
    cmake: str
    generator: str
    compiler: str


def find_toolchain(backend: Backend) -> Toolchain:
    """Locate CMake, the compilers and a build tool, or say which package to install."""
    needed = list(_REQUIRED)
    if backend in _BACKEND_TOOLS:
        needed.append(_BACKEND_TOOLS[backend])
    for program, package, what in needed:
        if shutil.which(program) is None:
            raise ToolMissingError(
                f"{what} ({program}) is not installed; install it with "
                f"`apt-get install {package}` and run the build again"
            )
    if shutil.which("ninja"):
        generator = "Ninja"
    elif shutil.which("make"):
        generator = "Unix Makefiles"
    else:
        raise ToolMissingError(
            "neither ninja nor make is installed; install one with "
            "`apt-get install ninja-build` (or `make`) and run the build again"
        )
    return Toolchain(cmake=str(shutil.which("cmake")), generator=generator,
                     compiler=compiler_version())


def compiler_version() -> str:
    """First line of ``c++ --version``: part of the build key, so a new compiler rebuilds."""
    proc = subprocess.run(["c++", "--version"], capture_output=True, text=True, check=False)
    lines = proc.stdout.strip().splitlines()
    return lines[0] if lines else "unknown"
