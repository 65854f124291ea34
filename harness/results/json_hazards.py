"""What a JSON Schema cannot say about ``run.json``, checked around it.

Text that nests containers deep enough to exhaust the parser's stack is found before
parsing (:func:`nested_too_deep`). While parsing (:func:`load_json`), numbers JSON has
no spelling for (NaN, Infinity, 1e999), integers too long to convert cheaply and
objects that repeat a key are kept out of the body as markers; :func:`unrepresentable`
finds the first of them afterwards, and non-finite floats, lone surrogates and deep
nesting in a body built in code, so the refusal can name the value's JSON path.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from harness.results.run_schema import MAX_DEPTH, MAX_INT_DIGITS
from harness.results.schema_messages import json_path, show_value


@dataclass(frozen=True)
class _Refused:
    """A JSON value kept out of the parsed body, reported later with its path."""

    problem: str


class _Duplicated(dict[str, Any]):
    """A JSON object that repeats a key (readers disagree on which value wins)."""

    duplicate: str = ""


def _refuse_constant(name: str) -> _Refused:
    return _Refused(f"{name} is not allowed: expected a finite number (NaN and Infinity "
                    "are not JSON)")


def _float(literal: str) -> float | _Refused:
    value = float(literal)
    if math.isfinite(value):
        return value
    return _Refused(f"{show_value(literal)} is not allowed: it overflows to infinity; "
                    "expected a finite number")


def _int(literal: str) -> int | _Refused:
    digits = len(literal.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        return _Refused(f"an integer of {digits} digits is not allowed: expected at most "
                        f"{MAX_INT_DIGITS} digits")
    return int(literal)


def _dict(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    body = dict(pairs)
    if len(body) == len(pairs):
        return body
    repeated = _Duplicated(body)
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            repeated.duplicate = key
            break
        seen.add(key)
    return repeated


def load_json(text: str) -> object:
    """``text`` parsed, with the values no schema can refuse left in as markers.

    Raises json.JSONDecodeError for text that is not JSON (and RecursionError for
    nesting :func:`nested_too_deep` would have refused).
    """
    return json.loads(text, parse_constant=_refuse_constant, parse_float=_float,
                      parse_int=_int, object_pairs_hook=_dict)


# Stripping escapes first leaves strings without backslashes, so matching them is
# linear: a hostile run of \" cannot make the string pattern backtrack.
_ESCAPE = re.compile(r"\\.", re.DOTALL)
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


def nested_too_deep(text: str) -> bool:
    """Whether ``text`` nests containers deeper than :data:`MAX_DEPTH`, without parsing.

    json.loads recurses once per level; 100 000 levels could exhaust the C stack where
    the recursion limit is raised, so depth is measured on the brackets alone first.
    """
    skeleton = _NOT_BRACKET.sub("", _STRING.sub("", _ESCAPE.sub("", text)))
    # Pass n removes every pair whose contents are n - 1 levels deep: MAX_DEPTH passes
    # empty a well-nested document that is shallow enough.
    for _ in range(MAX_DEPTH):
        skeleton, removed = _EMPTY_PAIR.subn("", skeleton)
        if not skeleton:
            return False
        if not removed:
            break
    else:
        # An empty pair now held MAX_DEPTH levels inside it.
        if _EMPTY_PAIR.search(skeleton):
            return True
    # No pair is left, only brackets that do not match: a syntax error json.loads names
    # better, at the first closing bracket left at the latest. Too deep if the opening
    # brackets before it nest so (a document cut off after 100 000 of them).
    unclosed = len(skeleton) - len(skeleton.lstrip("[{"))
    return unclosed > MAX_DEPTH


def unrepresentable(body: object) -> tuple[str, str] | None:
    """The path and problem of the first value (in document order) no schema can refuse.

    A refused number or duplicate key from parsing, a NaN or infinity from code, a
    string with a lone surrogate (not UTF-8, so neither backend can store it), or
    nesting deeper than :data:`MAX_DEPTH` (a body built in code). Iterative: depth is
    what is being checked.
    """
    stack: list[tuple[tuple[str | int, ...], object]] = [((), body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _Refused):
            return json_path(path), value.problem
        if isinstance(value, float) and not math.isfinite(value):
            return json_path(path), f"{value} is not allowed: expected a finite number"
        if isinstance(value, str) and not value.isascii() and not is_utf8(value):
            return json_path(path), "a lone surrogate is not allowed: expected UTF-8 text"
        if not isinstance(value, dict | list | tuple):
            continue
        if len(path) >= MAX_DEPTH:
            return json_path(path), (f"containers nested more than {MAX_DEPTH} deep are "
                                     "not allowed")
        if isinstance(value, _Duplicated):
            return json_path((*path, value.duplicate)), "a repeated key is not allowed"
        items: Iterable[tuple[str | int, object]] = (
            value.items() if isinstance(value, dict) else enumerate(value))
        for key, item in reversed(list(items)):
            stack.append(((*path, key), item))
            if isinstance(key, str) and not key.isascii():
                # Popped before its value: a key's own problem comes first.
                stack.append(((*path, key), key))
    return None


def is_utf8(text: str) -> bool:
    """Whether ``text`` has no lone surrogate (which UTF-8 cannot encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
