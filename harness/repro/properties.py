"""What a run leaves in ``environment.properties`` for ``harness repro``, both ways (pure).

The recording plugin writes these beside the build and hardware properties it always
writes; ``harness repro`` reads them back to rebuild the exact build, plan for the same
GPU and run the test from the same directory. ``parse_properties`` reads the file the way
``java.util.Properties.load`` does, so it undoes ``allure_meta.escape_property``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path

from harness.errors import ConfigError
from harness.facts.gpu import GpuInfo

#: The CMake flags of the build under test, as a JSON list (flags may hold spaces).
CMAKE_FLAGS = "build.cmake_flags"
#: The GPU ``plan_for`` planned with when a test named none: ``NAME:VRAM_MIB`` or ``none``.
PLANNER_GPU = "planner.gpu"
#: pytest's rootdir: node ids are relative to it.
ROOTDIR = "pytest.rootdir"
NO_GPU = "none"

_GPU_SPEC = re.compile(r"(?P<name>.+):(?P<vram>\d+)")


def repro_properties(*, cmake_flags: Sequence[str] | None, planner_gpu: GpuInfo | None,
                     rootdir: Path) -> dict[str, str]:
    """The properties a later ``harness repro`` needs, for ``environment.properties``."""
    props = {PLANNER_GPU: format_gpu_spec(planner_gpu) if planner_gpu else NO_GPU,
             ROOTDIR: str(rootdir)}
    if cmake_flags is not None:
        props[CMAKE_FLAGS] = json.dumps(list(cmake_flags))
    return props


def format_gpu_spec(gpu: GpuInfo) -> str:
    return f"{gpu.name}:{gpu.vram_mib}"


def parse_gpu_spec(text: str, what: str = "--harness-planner-gpu") -> GpuInfo:
    """``NAME:VRAM_MIB`` (the name may hold colons; the VRAM is the last field)."""
    match = _GPU_SPEC.fullmatch(text.strip())
    if match is None or not match["name"].strip() or int(match["vram"]) < 1:
        raise ConfigError(f"{what} {text!r} is not NAME:VRAM_MIB; write the GPU's name and "
                          "its memory in MiB, e.g. 'NVIDIA H200:143771'")
    return GpuInfo(name=match["name"].strip(), vram_mib=int(match["vram"]))


def recorded_cmake_flags(props: dict[str, str]) -> tuple[str, ...] | None:
    """The recorded CMake flags; None for a run recorded before they were."""
    raw = props.get(CMAKE_FLAGS)
    if raw is None:
        return None
    try:
        flags = json.loads(raw)
    except ValueError:
        flags = None
    if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
        raise ConfigError(f"environment property {CMAKE_FLAGS} is {raw!r}, not a JSON list of "
                          "flags; the results were edited or written by another tool")
    return tuple(flags)


def recorded_planner_gpu(props: dict[str, str]) -> GpuInfo | None:
    """The GPU the run's ``plan_for`` defaulted to; None when it had none.

    A run recorded before the property existed planned without a default GPU (the
    planner had no such option then), so None is also the faithful answer for it.
    """
    raw = props.get(PLANNER_GPU, NO_GPU)
    return None if raw == NO_GPU else parse_gpu_spec(raw, f"environment property {PLANNER_GPU}")


# --- java.util.Properties.load ----------------------------------------------------------------

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def parse_properties(text: str) -> dict[str, str]:
    """``key=value`` pairs of a ``.properties`` file, unescaped; the last of a key wins."""
    props: dict[str, str] = {}
    for line in _logical_lines(text):
        key, value = _split(line)
        props[key] = value
    return props


def _logical_lines(text: str) -> list[str]:
    """Lines without comments and blanks; a line ending in an odd run of ``\\`` goes on."""
    lines: list[str] = []
    pending = ""
    for raw in text.splitlines():
        part = raw.lstrip(" \t\f") if pending else raw
        if not pending and (not part.strip() or part.lstrip(" \t\f")[:1] in ("#", "!")):
            continue
        trailing = len(part) - len(part.rstrip("\\"))
        if trailing % 2 == 1:
            pending += part[:-1]
            continue
        lines.append((pending + part).lstrip(" \t\f"))
        pending = ""
    if pending:
        lines.append(pending.lstrip(" \t\f"))
    return lines


def _split(line: str) -> tuple[str, str]:
    index = 0
    while index < len(line):
        char = line[index]
        if char == "\\":
            index += 2
            continue
        if char in "=: \t\f":
            break
        index += 1
    key = line[:index]
    rest = line[index:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return _unescape(key), _unescape(rest)


def _unescape(text: str) -> str:
    units: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "\\" or index + 1 == len(text):
            units.append(char)
            index += 1
            continue
        nxt = text[index + 1]
        if nxt == "u" and re.fullmatch(r"[0-9A-Fa-f]{4}", text[index + 2:index + 6]):
            units.append(chr(int(text[index + 2:index + 6], 16)))
            index += 6
            continue
        units.append(_ESCAPES.get(nxt, nxt))
        index += 2
    # \uXXXX pairs are UTF-16 surrogates for characters outside the BMP: join them.
    return "".join(units).encode("utf-16", "surrogatepass").decode("utf-16")
