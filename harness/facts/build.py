"""What a llama-server build is: backend, version, source, flags and capabilities."""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from typing import Any

from harness.facts.release import Release, name_release


class Backend(enum.StrEnum):
    """The ggml backends the harness builds; values are the ``--backend`` option's words.

    Each maps to one ggml CMake switch (ggml/CMakeLists.txt: GGML_CUDA, GGML_HIP,
    GGML_VULKAN); ``cpu`` switches none on.
    """

    CPU = "cpu"
    CUDA = "cuda"
    ROCM = "rocm"
    VULKAN = "vulkan"


#: The backends that need a GPU: every one but ``cpu``.
GPU_BACKENDS = (Backend.CUDA, Backend.ROCM, Backend.VULKAN)


@dataclass(frozen=True)
class Capabilities:
    """What the built server accepts, read from its own ``--help``."""

    cache_types_k: tuple[str, ...] = ()
    cache_types_v: tuple[str, ...] = ()
    spec_types: tuple[str, ...] = ()
    #: Every long option the server knows, e.g. ``--n-cpu-moe``.
    flags: tuple[str, ...] = ()

    def accepts_flag(self, flag: str) -> bool:
        return flag in self.flags


@dataclass(frozen=True)
class BuildInfo:
    """The record ``build.json`` holds beside every built binary."""

    key: str
    backend: Backend
    binary: str
    version: str
    source_digest: str
    source_origin: str
    cmake_flags: tuple[str, ...]
    compiler: str
    build_seconds: float
    capabilities: Capabilities
    #: Container builds: the image tag, and the ids of the images it was built from.
    image: str | None = None
    base_image_digest: str | None = None
    #: The RPC server built beside the binary (``harness build --rpc``), else None.
    rpc_server: str | None = None

    @property
    def has_rpc(self) -> bool:
        """Whether this build can spread a model over RPC devices: its server takes
        ``--rpc`` and its RPC server was built."""
        return self.rpc_server is not None and self.capabilities.accepts_flag("--rpc")

    @property
    def version_line(self) -> str:
        """The server's ``--version`` line, with what pins its source where that is unknown.

        A tree without git history (the pinned PyPI sdist, a copied fork) builds as
        ``build 0, commit unknown``, which names nothing; the source's origin and digest
        do (``pypi:PACKAGE==VERSION`` and the sdist's sha256, or ``local:PATH`` and the
        tree's content digest).
        """
        first = self.version.splitlines()[0].strip() if self.version.strip() else "unknown"
        if first != "unknown" and "commit unknown" not in first:
            return first
        kind = "sha256" if self.source_origin.startswith("pypi:") else "content digest"
        # A deep local path is cut, not the digest: the run record's text fields are
        # bounded (1024 characters) and the digest is what identifies the tree.
        origin = self.source_origin if len(self.source_origin) <= 512 else (
            "…" + self.source_origin[-511:])
        return f"{first[:256]}; source {origin} ({kind} {self.source_digest[:16]})"

    @property
    def release(self) -> Release:
        """The llama.cpp release this build is (``facts/release.py``): from ``--version``,
        else the source package's version, else the tree."""
        return name_release(self.version, self.source_origin, self.source_digest)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["backend"] = self.backend.value
        data["cmake_flags"] = list(self.cmake_flags)
        data["capabilities"] = {k: list(v) for k, v in asdict(self.capabilities).items()}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> BuildInfo:
        caps = data["capabilities"]
        return cls(
            key=str(data["key"]),
            backend=Backend(data["backend"]),
            binary=str(data["binary"]),
            version=str(data["version"]),
            source_digest=str(data["source_digest"]),
            source_origin=str(data["source_origin"]),
            cmake_flags=tuple(data["cmake_flags"]),
            compiler=str(data["compiler"]),
            build_seconds=float(data["build_seconds"]),
            capabilities=Capabilities(
                cache_types_k=tuple(caps["cache_types_k"]),
                cache_types_v=tuple(caps["cache_types_v"]),
                spec_types=tuple(caps["spec_types"]),
                flags=tuple(caps["flags"]),
            ),
            image=data.get("image"),
            base_image_digest=data.get("base_image_digest"),
            rpc_server=data.get("rpc_server"),
        )
