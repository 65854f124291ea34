"""The verdict on a build that cannot run on this host: what it asked for, what the CPU has.

The one piece of I/O is reading ``/proc/cpuinfo``; the comparison is
``harness.verdicts.instruction_sets`` (pure).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from harness.errors import CannotRunHereError
from harness.verdicts.failure import StartFailure
from harness.verdicts.instruction_sets import GGML_ISA_FLAGS, host_isa_flags, isa_mismatch

CPUINFO = Path("/proc/cpuinfo")
#: The missing feature named when the build's flags do not say which set it was.
UNNAMED = ("an instruction set this CPU lacks",)


def host_flags(cpuinfo: Path = CPUINFO) -> frozenset[str]:
    try:
        return host_isa_flags(cpuinfo.read_text(encoding="utf-8", errors="replace"))
    except OSError:
        return frozenset()


def cannot_run_here(failure: StartFailure, cmake_flags: Sequence[str] | None,
                    binary: str, *, cpuinfo: Path = CPUINFO) -> CannotRunHereError:
    """The error for ``failure`` (``FailureClass.CANNOT_RUN_HERE``) of ``binary``, built
    with ``cmake_flags`` (None: not known, a binary the harness did not build)."""
    host = host_flags(cpuinfo)
    if cmake_flags is None:
        known = ", ".join(sorted(host & set(GGML_ISA_FLAGS.values()))) or "none of ggml's"
        return CannotRunHereError(
            UNNAMED,
            f"{binary} cannot run on this host ({failure.evidence}); the harness did not "
            f"build it, so its instruction sets are not known (this CPU's flags: {known}); "
            "build it here with `harness build`, or run it where it was built")
    mismatch = isa_mismatch(cmake_flags, host)
    return CannotRunHereError(
        mismatch.missing or UNNAMED,
        f"{binary} cannot run on this host ({failure.evidence}): {mismatch.describe()}")
