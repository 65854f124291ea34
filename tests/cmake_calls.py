"""The CMake calls among a Dockerfile's ``RUN`` commands, for ``dockerfile_parser`` (pure).

The configure call with the flags as cmake receives them (``-S``/``-B``, every ``-D``,
and anything else), and the targets each ``cmake --build`` builds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from shell_commands import ShellCommand


@dataclass(frozen=True)
class CMakeConfigure:
    """The ``cmake -S … -B …`` call: its arguments as cmake receives them."""

    stage: str
    line: int
    argv: tuple[str, ...]
    assignments: tuple[tuple[str, str], ...]
    source: str | None
    build_dir: str | None
    #: Every ``-D`` flag, written ``-DNAME=VALUE`` also where it was ``-D NAME=VALUE``.
    definitions: tuple[str, ...]
    #: Arguments that are neither ``-S``/``-B`` nor ``-D`` (a generator, a ``-C`` cache…).
    other: tuple[str, ...]


@dataclass(frozen=True)
class CMakeBuild:
    """A ``cmake --build`` call and the targets it names (empty: everything)."""

    stage: str
    line: int
    build_dir: str | None
    targets: tuple[str, ...]
    argv: tuple[str, ...]


def configure_calls(commands: Iterable[ShellCommand]) -> list[CMakeConfigure]:
    """Every CMake configure call among ``commands``, in order."""
    return [_configure(cmd) for cmd in commands
            if _is_cmake(cmd) and _cmake_mode(cmd.argv) == "configure"]


def build_calls(commands: Iterable[ShellCommand]) -> tuple[CMakeBuild, ...]:
    """Every ``cmake --build`` call among ``commands``, with the targets it builds."""
    return tuple(_build(cmd) for cmd in commands
                 if _is_cmake(cmd) and _cmake_mode(cmd.argv) == "build")


def _is_cmake(cmd: ShellCommand) -> bool:
    return bool(cmd.argv) and Path(cmd.argv[0]).name == "cmake"


def _cmake_mode(argv: tuple[str, ...]) -> str:
    options = set(argv[1:])
    if "--build" in options:
        return "build"
    if options & {"--install", "-E", "-P", "--version", "--help"}:
        return "other"
    return "configure"


def _configure(cmd: ShellCommand) -> CMakeConfigure:
    args = list(cmd.argv[1:])
    source = build_dir = None
    definitions: list[str] = []
    other: list[str] = []
    while args:
        word = args.pop(0)
        if word in ("-S", "-B", "-D") and args:
            value = args.pop(0)
            if word == "-D":
                definitions.append(f"-D{value}")
            elif word == "-S":
                source = value
            else:
                build_dir = value
        elif word.startswith("-D") and len(word) > 2:
            definitions.append(word)
        elif word.startswith("-S") and len(word) > 2:
            source = word[2:]
        elif word.startswith("-B") and len(word) > 2:
            build_dir = word[2:]
        else:
            other.append(word)
    return CMakeConfigure(cmd.stage, cmd.line, cmd.argv[1:], cmd.assignments, source,
                          build_dir, tuple(definitions), tuple(other))


def _build(cmd: ShellCommand) -> CMakeBuild:
    args = list(cmd.argv[1:])
    build_dir = None
    targets: list[str] = []
    while args:
        word = args.pop(0)
        if word == "--build" and args:
            build_dir = args.pop(0)
        elif word in ("--target", "-t"):
            # cmake takes every following word up to the next option as a target.
            while args and not args[0].startswith("-"):
                targets.append(args.pop(0))
        elif word.startswith("--target="):
            targets.append(word.removeprefix("--target="))
    return CMakeBuild(cmd.stage, cmd.line, build_dir, tuple(targets), cmd.argv[1:])
