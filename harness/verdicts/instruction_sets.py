"""Which instruction sets a CPU build asked for, against the ones this host has (pure).

A build that dies of SIGILL (``FailureClass.CANNOT_RUN_HERE``) was compiled for a CPU
this one is not. The verdict names the difference: the x86 extensions its CMake flags
switch on (ggml's ``GGML_<ISA>`` options; ``GGML_NATIVE``, ggml's default, asks for
whatever the compiling machine had) against the ``flags`` line of ``/proc/cpuinfo``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

#: ggml's CMake options (ggml/CMakeLists.txt, pinned source) and the /proc/cpuinfo flag
#: each needs (the kernel's names, arch/x86/include/asm/cpufeatures.h).
GGML_ISA_FLAGS: Mapping[str, str] = {
    "GGML_SSE42": "sse4_2", "GGML_AVX": "avx", "GGML_AVX2": "avx2", "GGML_BMI2": "bmi2",
    "GGML_FMA": "fma", "GGML_F16C": "f16c", "GGML_AVX_VNNI": "avx_vnni",
    "GGML_AVX512": "avx512f", "GGML_AVX512_VBMI": "avx512vbmi",
    "GGML_AVX512_VNNI": "avx512_vnni", "GGML_AVX512_BF16": "avx512_bf16",
    "GGML_AMX_TILE": "amx_tile", "GGML_AMX_INT8": "amx_int8", "GGML_AMX_BF16": "amx_bf16",
}
_ON = frozenset({"ON", "1", "TRUE", "YES"})


@dataclass(frozen=True)
class IsaMismatch:
    """``asked``: the extensions the build's flags name; ``missing``: those the host lacks;
    ``native``: the build was made for the compiling machine's CPU (``GGML_NATIVE``)."""

    asked: tuple[str, ...]
    missing: tuple[str, ...]
    native: bool
    host: tuple[str, ...]

    def describe(self) -> str:
        host = ", ".join(self.host) or "none of ggml's x86 extensions"
        if self.missing:
            return (f"the build asked for {', '.join(self.missing)}, which this CPU lacks "
                    f"(it has {host})")
        if self.native:
            return ("the build was made with GGML_NATIVE for the CPU that compiled it, "
                    f"which had an extension this one lacks (this CPU has {host}); rebuild "
                    "here, or with -DGGML_NATIVE=OFF and the GGML_<ISA> flags this CPU has")
        asked = ", ".join(self.asked) or "no extension by name"
        return (f"the build's flags ask for {asked}, all of which this CPU has ({host}); "
                "the instruction came from elsewhere (a library it loads, or a flag set "
                "outside its CMake options)")


def _cmake_options(flags: Iterable[str]) -> dict[str, str]:
    options = {}
    for flag in flags:
        if flag.startswith("-D") and "=" in flag:
            name, value = flag[2:].split("=", 1)
            options[name.split(":", 1)[0]] = value
    return options


def host_isa_flags(cpuinfo: str) -> frozenset[str]:
    """The ``flags`` of the first processor in ``/proc/cpuinfo`` text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return frozenset(value.split())
    return frozenset()


def isa_mismatch(cmake_flags: Iterable[str], host: frozenset[str]) -> IsaMismatch:
    """The extensions ``cmake_flags`` switch on, and which of them ``host`` lacks.

    ``GGML_NATIVE`` is ON unless the flags turn it off (ggml's default)."""
    options = _cmake_options(cmake_flags)
    asked = tuple(isa for option, isa in GGML_ISA_FLAGS.items()
                  if options.get(option, "").upper() in _ON)
    native = options.get("GGML_NATIVE", "ON").upper() in _ON
    known = sorted(host & set(GGML_ISA_FLAGS.values()))
    return IsaMismatch(asked, tuple(isa for isa in asked if isa not in host), native,
                       tuple(known))
