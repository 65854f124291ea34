"""JSON text another program sent, read with the numbers JSON has no spelling for refused.

Python's json module reads ``NaN``, ``Infinity`` and ``-Infinity``, and reads ``1e999``
as infinity: an answer carrying one would put a non-finite number into a figure, a
comparison or a card config. While parsing they are kept out as markers; the first one
in document order is then named by its JSON path (``$.runs[0].figures[3].value``).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from harness.results.schema_messages import json_path


class NotFiniteError(ValueError):
    """A number that is not finite, at ``path``; ``literal`` is how the text spelled it."""

    def __init__(self, literal: str, path: str) -> None:
        super().__init__(f"a number that is not finite ({literal}) at {path}")
        self.literal = literal
        self.path = path


@dataclass(frozen=True)
class _NotFinite:
    literal: str


def _float(literal: str) -> float | _NotFinite:
    value = float(literal)
    return value if math.isfinite(value) else _NotFinite(literal)


def loads_finite(text: str | bytes) -> Any:
    """``text`` parsed; raises :class:`NotFiniteError` for a NaN or an infinity, and a
    ValueError (``json.JSONDecodeError``, or RecursionError's kin) for text that is not
    JSON."""
    try:
        body = json.loads(text, parse_constant=_NotFinite, parse_float=_float)
    except RecursionError as exc:
        # The parser recurses once per level; nesting past the limit is no answer of ours.
        raise ValueError("containers nested too deep to read") from exc
    found = _first_marker(body)
    if found is not None:
        literal, path = found
        raise NotFiniteError(literal, path)
    return body


def _first_marker(body: Any) -> tuple[str, str] | None:
    # Iterative: nesting as deep as the parser took must not exhaust the stack here.
    stack: list[tuple[tuple[str | int, ...], Any]] = [((), body)]
    while stack:
        path, value = stack.pop()
        if isinstance(value, _NotFinite):
            return value.literal, json_path(path)
        if isinstance(value, dict):
            items = list(value.items())
        elif isinstance(value, list):
            items = list(enumerate(value))
        else:
            continue
        stack.extend(((*path, key), item) for key, item in reversed(items))
    return None
