"""What a native CUDA build of llama-server needs from the host: nvcc, cuBLAS, libcuda.

Gathered by ``harness/probes/cuda_toolkit.py``; turned into CMake flags by
``harness/planning/build_plan.py`` (``cuda_toolkit_flags``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class CublasOrigin(enum.StrEnum):
    """Where cuBLAS comes from: the toolkit's own tree (NVIDIA's installer, Debian's
    ``libcublas-dev``) or a PyPI wheel (``nvidia-cublas``) in the harness's environment."""

    TOOLKIT = "toolkit"
    WHEEL = "wheel"


class DriverLibraryOrigin(enum.StrEnum):
    """Where the ``libcuda.so`` that ggml-cuda links (its VMM pool calls the driver API)
    comes from: the toolkit's link stub, or the installed NVIDIA driver itself."""

    STUB = "toolkit stub"
    DRIVER = "driver"


@dataclass(frozen=True)
class Cublas:
    origin: CublasOrigin
    version: str
    #: The directory holding ``cublas_v2.h``.
    include_dir: str
    #: ``libcublas.so*`` and ``libcublasLt.so*``.
    library: str
    lt_library: str
    #: The wheel's distribution name (``nvidia-cublas``); None for the toolkit's.
    distribution: str | None = None

    def describe(self) -> str:
        where = f"the {self.distribution} wheel" if self.distribution else "the toolkit"
        return f"cuBLAS {self.version} from {where} ({self.library.rsplit('/', 1)[0]})"


@dataclass(frozen=True)
class DriverLibrary:
    origin: DriverLibraryOrigin
    path: str


@dataclass(frozen=True)
class CudaToolkit:
    """nvcc (its path, version and toolkit root) and what it was found with."""

    nvcc: str
    #: ``13.0.88``: the ``V…`` of ``nvcc --version``, the number CMake reads too.
    version: str
    #: The toolkit root, nvcc's ``bin/``'s parent (``/usr/local/cuda``).
    root: str
    cublas: Cublas | None = None
    driver: DriverLibrary | None = None
    #: Why cuBLAS was not found where it was looked for (None when it was found).
    cublas_problem: str | None = None

    @property
    def major(self) -> int:
        return int(self.version.split(".", 1)[0])

    def describe(self) -> str:
        """What the build key and ``build.json`` name: nvcc and the cuBLAS it links."""
        cublas = self.cublas.describe() if self.cublas else "no cuBLAS"
        return f"nvcc {self.version} ({self.nvcc}); {cublas}"
