"""The CMake invocation for a llama-server build, and the key that caches it (pure)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

from harness.facts.build import Backend

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

SERVER_TARGET = "llama-server"
#: Bumped when the layout of a build directory changes, so old caches are not reused.
LAYOUT_VERSION = 1


@dataclass(frozen=True)
class BuildRequest:
    """What the user asked for: a backend, native CPU tuning or not, extra CMake flags."""

    backend: Backend = Backend.CPU
    native: bool = False
    extra_cmake_args: tuple[str, ...] = ()

    def cmake_flags(self) -> tuple[str, ...]:
        """The ``-D`` flags, in a fixed order (the order is part of the build key)."""
        # GGML_NATIVE is off by default so a binary built here runs on any x86-64 CPU
        # of the runner fleet, not only on the one that compiled it.
        flags = [*BASE_FLAGS, f"-DGGML_NATIVE={'ON' if self.native else 'OFF'}"]
        switch = _BACKEND_SWITCH[self.backend]
        if switch:
            flags.append(f"-D{switch}=ON")
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
    return f"{request.backend.value}-{hashlib.sha256(payload.encode()).hexdigest()[:16]}"


def configure_argv(cmake: str, source: str, build_dir: str, generator: str,
                   request: BuildRequest) -> list[str]:
    return [cmake, "-S", source, "-B", build_dir, "-G", generator, *request.cmake_flags()]


def build_argv(cmake: str, build_dir: str, jobs: int) -> list[str]:
    return [cmake, "--build", build_dir, "--target", SERVER_TARGET, "--parallel", str(jobs)]
