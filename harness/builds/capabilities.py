"""Reads what a llama-server build accepts from its own ``--help`` text (pure).

The help is laid out by common/arg.cpp: an option's names and argument start at column
0, its description starts in the column after them (or on the next line when the names
are long), continuation lines are indented to that column. ``--cache-type-k/-v`` list
their values as ``allowed values: a, b, …``; ``--spec-type`` names its values in its
argument (``none,draft-simple,…``).

``bare_binary_info`` makes the record of a binary with no ``build.json`` (a fork built by
its own CI, a binary carried to a GPU machine) from what the binary itself printed, the
same fields ``harness build`` records, so planning and reports treat it like a build;
an RPC server found beside it is its ``rpc_server`` when its help lists ``--rpc``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.facts.build import Backend, BuildInfo, Capabilities

#: Where descriptions start in llama.cpp's help layout; a gap reaching at least this
#: column separates an option's names from its description.
_DESCRIPTION_COLUMN = 38
_GAP = re.compile(r"\s{2,}")
_FLAG = re.compile(r"(?:^|[\s,])(--?[A-Za-z0-9][\w.-]*)")
_ALLOWED = re.compile(r"allowed values:\s*([^\n(]+)")


@dataclass(frozen=True)
class OptionHelp:
    names: tuple[str, ...]
    argument: str
    description: str


def parse_options(help_text: str) -> dict[str, OptionHelp]:
    """Every option in the help, indexed by each of its names."""
    options: dict[str, OptionHelp] = {}
    header: str | None = None
    description: list[str] = []

    def flush() -> None:
        if header is None:
            return
        names_part, first_line = _split_header(header)
        names = tuple(_FLAG.findall(names_part))
        argument = names_part.split()[-1] if names_part.split() else ""
        if argument.startswith("-") or argument.rstrip(",") in names:
            argument = ""
        option = OptionHelp(names=names, argument=argument,
                            description=" ".join([first_line, *description]).strip())
        for name in names:
            options.setdefault(name, option)

    for line in help_text.splitlines():
        if line.startswith("-") and not line.startswith("-----"):
            flush()
            header, description = line, []
        elif header is not None and line.startswith(" "):
            description.append(line.strip())
        else:
            flush()
            header, description = None, []
    flush()
    return options


def _split_header(line: str) -> tuple[str, str]:
    for gap in _GAP.finditer(line):
        if gap.end() >= _DESCRIPTION_COLUMN:
            return line[: gap.start()], line[gap.end():]
    return line.rstrip(), ""


def allowed_values(option: OptionHelp) -> tuple[str, ...]:
    """The ``allowed values: …`` list of an option's description."""
    match = _ALLOWED.search(option.description)
    if not match:
        return ()
    return tuple(v.strip() for v in match.group(1).split(",") if v.strip())


def parse_capabilities(help_text: str) -> Capabilities:
    options = parse_options(help_text)
    cache_k = options.get("--cache-type-k")
    cache_v = options.get("--cache-type-v")
    spec = options.get("--spec-type")
    spec_types = tuple(v for v in spec.argument.split(",") if v) if spec else ()
    return Capabilities(
        cache_types_k=allowed_values(cache_k) if cache_k else (),
        cache_types_v=allowed_values(cache_v) if cache_v else (),
        spec_types=spec_types,
        flags=tuple(sorted({name for name in options if name.startswith("--")})),
    )


#: What a bare binary's record says where no build recorded it.
UNKNOWN = "unknown"


def bare_binary_key(backend: Backend, sha256: str) -> str:
    """The build key of a bare binary: its backend and content hash, so the same file is
    the same build in every run record, wherever it lies."""
    return f"{backend.value}-binary-{sha256[:16]}"


def bare_binary_info(*, binary: str, sha256: str, backend: Backend, version: str,
                     help_text: str, rpc_server: str | None = None) -> BuildInfo:
    """The record of a binary no ``harness build`` made, from its own output (pure).

    Its source, flags and compiler are not known, so they say so; ``source_origin`` names
    the file and its hash. ``rpc_server`` is the RPC server found beside it (a device
    check carries one): recorded only when the binary's help lists ``--rpc``, since a
    server without the RPC client has nothing to point at it.
    """
    capabilities = parse_capabilities(help_text)
    return BuildInfo(
        key=bare_binary_key(backend, sha256),
        backend=backend,
        binary=binary,
        version=version or UNKNOWN,
        source_digest=UNKNOWN,
        source_origin=f"binary:{binary} (sha256 {sha256})",
        cmake_flags=(),
        compiler=UNKNOWN,
        build_seconds=0.0,
        capabilities=capabilities,
        rpc_server=rpc_server if capabilities.accepts_flag("--rpc") else None,
    )
