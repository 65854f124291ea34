"""Finds a CUDA toolkit for a native build: nvcc, cuBLAS (toolkit or wheel), libcuda.

nvcc is ``nvcc`` on ``PATH``, else NVIDIA's default ``/usr/local/cuda/bin/nvcc`` (the
installer does not put it on ``PATH``). cuBLAS is the toolkit's own when its tree has
``cublas_v2.h`` and ``libcublas.so`` (NVIDIA's installer, Debian's ``libcublas-dev``);
otherwise PyPI's wheel for nvcc's major version (``nvidia-cublas`` for CUDA 13: headers
and ``libcublas*.so.13`` under ``site-packages/nvidia/cu13``) installed in the harness's
own environment. The ``libcuda.so`` ggml-cuda links is the toolkit's link stub, else the
installed driver's. Parsers are pure; the functions at the bottom look.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path

from harness.errors import ToolMissingError
from harness.facts.cuda_toolkit import (
    Cublas,
    CublasOrigin,
    CudaToolkit,
    DriverLibrary,
    DriverLibraryOrigin,
)
from harness.planning.build_plan import cublas_wheel_name

#: Where NVIDIA's installer puts the toolkit (FindCUDAToolkit looks there too).
DEFAULT_ROOT = Path("/usr/local/cuda")
#: ``nvcc --version``'s last lines: "Cuda compilation tools, release 13.0, V13.0.88".
_NVCC_VERSION = re.compile(r"\bV(\d+\.\d+\.\d+)\b")
#: ``nvcc -v``'s dry run names the toolkit it belongs to ("#$ TOP=/usr/local/cuda-13.0/bin/..");
#: CMake's FindCUDAToolkit reads the same line.
_NVCC_TOP = re.compile(r"^#\$ TOP=(?P<top>.+?)\s*$", re.MULTILINE)
_CUBLAS_VER = re.compile(r"#define\s+CUBLAS_VER_(MAJOR|MINOR|PATCH|BUILD)\s+(\d+)")
#: ``ldconfig -p`` lines: "	libcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1".
_LDCONFIG = re.compile(r"^\s*(libcuda\.so(?:\.1)?) \((?P<abi>[^)]*)\) => (?P<path>\S+)\s*$")
#: Library directories a Linux NVIDIA driver installs ``libcuda.so.1`` into.
_DRIVER_DIRS = ("/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib/wsl/lib", "/usr/lib")


def parse_nvcc_version(text: str) -> str | None:
    """``13.0.88`` from ``nvcc --version`` (the ``V…`` CMake's FindCUDAToolkit reads)."""
    match = _NVCC_VERSION.search(text)
    return match.group(1) if match else None


def parse_nvcc_top(text: str) -> str | None:
    """The toolkit root ``nvcc -v`` reports (``TOP``), normalised."""
    match = _NVCC_TOP.search(text)
    return os.path.normpath(match["top"]) if match else None


def parse_cublas_header_version(text: str) -> str | None:
    """``13.1.1.3`` from ``cublas_api.h``'s ``CUBLAS_VER_*`` defines."""
    parts = dict(_CUBLAS_VER.findall(text))
    if "MAJOR" not in parts or "MINOR" not in parts:
        return None
    return ".".join(parts[k] for k in ("MAJOR", "MINOR", "PATCH", "BUILD") if k in parts)


def wheel_files(files: Iterable[str]) -> tuple[str, str, str] | None:
    """(``cublas_v2.h``'s directory, ``libcublas.so*``, ``libcublasLt.so*``) among a
    wheel's files, as paths relative to site-packages; None when one is missing."""
    include = library = lt_library = None
    for name in sorted(files):
        base = name.rsplit("/", 1)[-1]
        if base == "cublas_v2.h":
            include = name.rsplit("/", 1)[0]
        elif base.startswith("libcublas.so"):
            library = name
        elif base.startswith("libcublasLt.so"):
            lt_library = name
    if include is None or library is None or lt_library is None:
        return None
    return include, library, lt_library


def parse_ldconfig_driver(text: str) -> str | None:
    """The 64-bit ``libcuda.so`` (else ``libcuda.so.1``) ``ldconfig -p`` lists."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        match = _LDCONFIG.match(line)
        if match and "64" in match["abi"]:
            found.setdefault(match.group(1), match["path"])
    return found.get("libcuda.so") or found.get("libcuda.so.1")


NVCC_HINT = ("install a CUDA toolkit: NVIDIA's (nvcc at /usr/local/cuda/bin/nvcc) or "
             "`apt-get install nvidia-cuda-toolkit`, or put nvcc on PATH")


# --- looking -------------------------------------------------------------------------


def find_nvcc() -> Path | None:
    on_path = shutil.which("nvcc")
    if on_path:
        return Path(on_path)
    default = DEFAULT_ROOT / "bin" / "nvcc"
    return default if os.access(default, os.X_OK) else None


def find_cuda_toolkit() -> CudaToolkit | None:
    """The toolkit a native CUDA build would use; None when there is no nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        return None
    version = parse_nvcc_version(_output([str(nvcc), "--version"]))
    if version is None:
        return None
    # nvcc on PATH may be a wrapper script or a link (Debian's /usr/bin/nvcc): its dry run
    # names the real toolkit; the directory above the nvcc found is looked in too, for
    # Debian's scattered layout (headers and libraries under /usr).
    top = parse_nvcc_top(_output([str(nvcc), "-v", "__harness_probe"]))
    roots = list(dict.fromkeys(Path(p) for p in (top, nvcc.absolute().parent.parent) if p))
    real_nvcc = roots[0] / "bin" / "nvcc"
    major = int(version.split(".", 1)[0])
    cublas = next((c for c in map(_toolkit_cublas, roots) if c), None) or _wheel_cublas(major)
    problem = None
    if cublas is None:
        problem = (f"neither the toolkit ({', '.join(map(str, roots))}: no cublas_v2.h and "
                   f"libcublas.so) nor an installed {cublas_wheel_name(major)} {major}.x "
                   "wheel has cuBLAS")
    driver = next((d for d in map(_driver_stub, roots) if d), None) or _driver_library()
    return CudaToolkit(nvcc=str(real_nvcc if os.access(real_nvcc, os.X_OK) else nvcc),
                       version=version, root=str(roots[0]), cublas=cublas, driver=driver,
                       cublas_problem=problem)


def _output(argv: list[str]) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False,
                              errors="replace")
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return proc.stdout + proc.stderr


def require_cuda_toolkit() -> CudaToolkit:
    """The toolkit, or ToolMissingError naming nvcc and how to install it."""
    toolkit = find_cuda_toolkit()
    if toolkit is None:
        raise ToolMissingError(f"the CUDA compiler (nvcc) is not found on PATH nor at "
                               f"{DEFAULT_ROOT / 'bin' / 'nvcc'}; {NVCC_HINT}, and build again")
    return toolkit


def _toolkit_dirs(root: Path, leaf: str) -> list[Path]:
    dirs = [root / leaf, *sorted(root.glob(f"targets/*/{leaf}"))]
    if leaf == "lib":
        dirs.insert(0, root / "lib64")
    if root == Path("/usr"):  # Debian's scattered layout
        dirs.append(root / "lib" / "x86_64-linux-gnu")
    return dirs


def _first(dirs: Iterable[Path], pattern: str) -> Path | None:
    for directory in dirs:
        hits = sorted(directory.glob(pattern)) if directory.is_dir() else []
        if hits:
            return hits[0]
    return None


def _toolkit_cublas(root: Path) -> Cublas | None:
    header = _first(_toolkit_dirs(root, "include"), "cublas_v2.h")
    lib_dirs = _toolkit_dirs(root, "lib")
    library = _first(lib_dirs, "libcublas.so")
    lt_library = _first(lib_dirs, "libcublasLt.so")
    if header is None or library is None or lt_library is None:
        return None
    api = header.parent / "cublas_api.h"
    version = parse_cublas_header_version(api.read_text(errors="replace")) \
        if api.is_file() else None
    return Cublas(CublasOrigin.TOOLKIT, version or "unknown", str(header.parent),
                  str(library), str(lt_library))


def _wheel_cublas(major: int) -> Cublas | None:
    name = cublas_wheel_name(major)
    try:
        dist = importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None
    # A wheel for another CUDA major links against another cudart: not this toolkit's.
    if not dist.version.startswith(f"{major}."):
        return None
    layout = wheel_files(str(f) for f in dist.files or ())
    if layout is None:
        return None
    include, library, lt_library = (str(Path(str(dist.locate_file(rel))).resolve())
                                    for rel in layout)
    return Cublas(CublasOrigin.WHEEL, dist.version, include, library, lt_library,
                  distribution=name)


def _driver_stub(root: Path) -> DriverLibrary | None:
    stub = _first([d / "stubs" for d in _toolkit_dirs(root, "lib")], "libcuda.so")
    return DriverLibrary(DriverLibraryOrigin.STUB, str(stub)) if stub else None


def _driver_library() -> DriverLibrary | None:
    listed = parse_ldconfig_driver(_output(["ldconfig", "-p"]))
    if listed is None:
        found = _first([Path(d) for d in _DRIVER_DIRS], "libcuda.so.1")
        listed = str(found) if found else None
    return DriverLibrary(DriverLibraryOrigin.DRIVER, listed) if listed else None
