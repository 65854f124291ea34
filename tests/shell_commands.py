"""The shell side of a Dockerfile ``RUN`` line, for ``dockerfile_parser`` (pure).

Only the subset of ``/bin/sh`` the harness's Dockerfiles use: simple commands joined by
``&&``, ``||``, ``;`` or ``|``, with leading ``NAME=value`` assignments, and the shell's
quoting and field splitting of ``$NAME`` / ``${NAME}``. Anything else (``$(…)``,
``${NAME:?…}``, a name the environment lacks) is left as written, so it shows in the
result instead of silently vanishing.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class ShellCommand:
    """One simple command of a ``RUN``, after the shell's expansion of build args."""

    stage: str
    line: int
    #: Leading ``NAME=value`` words: the environment this one command runs with.
    assignments: tuple[tuple[str, str], ...]
    argv: tuple[str, ...]


_SHELL_VAR = re.compile(r"\$(?:\{(?P<braced>[A-Za-z_]\w*)\}|(?P<bare>[A-Za-z_]\w*))")
#: Words that open a compound command; the simple command starts after them.
_RESERVED = frozenset({"!", "{", "}", "if", "then", "else", "elif", "fi", "do", "done",
                       "while", "until"})
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")


def expand_shell(text: str, env: Mapping[str, str]) -> str:
    """Expand the ``$NAME`` / ``${NAME}`` of ``env`` as ``sh`` does, keeping the text shell.

    Unquoted, the value is field-split on whitespace and each field written back quoted,
    so the later tokenising sees exactly the words the shell would pass on (no globbing:
    the Dockerfiles ``set -f`` before expanding flags). Inside double quotes the value
    stays one word; inside single quotes nothing expands.
    """
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            quote = None if char == "'" else quote
            out.append(char)
            i += 1
            continue
        if char == "\\" and i + 1 < len(text):
            out.append(text[i:i + 2])
            i += 2
            continue
        if char == '"':
            quote = None if quote == '"' else '"'
        elif char == "'" and quote is None:
            quote = "'"
        elif char == "$":
            match = _SHELL_VAR.match(text, i)
            name = (match.group("braced") or match.group("bare")) if match else None
            if match and name is not None and name in env:
                value = env[name]
                if quote == '"':
                    out.append(value.replace("\\", "\\\\").replace('"', '\\"'))
                else:
                    out.append(" ".join(shlex.quote(field) for field in value.split()))
                i = match.end()
                continue
        out.append(char)
        i += 1
    return "".join(out)


def split_commands(text: str) -> list[str]:
    """Cut a shell line at its unquoted ``&&``, ``||``, ``;``, ``|`` and ``&`` operators.

    Quotes and ``$(…)`` are respected, so ``tr ';' x`` and ``"$(a; b)"`` stay whole; the
    ``&`` of a redirection such as ``>&2`` is not an operator.
    """
    parts: list[str] = []
    current: list[str] = []
    quote: str | None = None
    depth = 0
    i = 0
    while i < len(text):
        char = text[i]
        if quote == "'":
            quote = None if char == "'" else quote
        elif char == "\\" and i + 1 < len(text):
            current.append(text[i:i + 2])
            i += 2
            continue
        elif char == '"':
            quote = None if quote == '"' else '"'
        elif char == "'" and quote is None:
            quote = "'"
        elif quote is None and text.startswith("$(", i):
            depth += 1
        elif quote is None and char == ")" and depth:
            depth -= 1
        elif (quote is None and depth == 0 and char in ";&|"
              and not (char == "&" and i and text[i - 1] in "<>")):
            end = i
            while end < len(text) and text[end] in ";&|":
                end += 1
            parts.append("".join(current))
            current = []
            i = end
            continue
        current.append(char)
        i += 1
    parts.append("".join(current))
    return [part for part in parts if part.strip()]


def simple_command(stage: str, line: int, words: list[str]) -> ShellCommand | None:
    """The command a segment's words make: reserved words dropped, leading assignments
    kept apart; None for a segment of reserved words only."""
    rest = list(words)
    while rest and rest[0] in _RESERVED:
        rest.pop(0)
    assignments: list[tuple[str, str]] = []
    while rest and _ASSIGNMENT.match(rest[0]):
        name, _, value = rest.pop(0).partition("=")
        assignments.append((name, value))
    if not rest and not assignments:
        return None
    return ShellCommand(stage, line, tuple(assignments), tuple(rest))
