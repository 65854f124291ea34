"""How a refused run record is put in words: JSON paths, short values, schema errors.

Shared by the readers of ``run.json`` so every :class:`RunRecordError` names the
refused value the same way: its JSON path (``$.outcomes[3].test_id``), the value cut
short, and what was expected, taken from the schema keyword jsonschema reported.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from jsonschema.exceptions import ValidationError

from harness.results.run_schema import PATTERN_WORDS, type_list

_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a finite number",
               "object": "an object", "array": "an array", "null": "null",
               "boolean": "true or false"}


def describe(error: ValidationError) -> tuple[str, str]:
    """The path of ``error`` and what is wrong there, in words."""
    path = tuple(error.absolute_path)
    # jsonschema types these as "maybe unset"; on an error from iter_errors they are set.
    instance: Any = error.instance
    constraint: Any = error.validator_value
    schema = cast(Mapping[str, Any], error.schema)
    kind = str(error.validator)
    if kind == "additionalProperties":
        known = schema.get("properties", {})
        extra = min((k for k in instance if k not in known), key=str)
        return json_path((*path, extra)), (
            f"unknown key (value {show_value(instance[extra])}) is not allowed: expected "
            f"one of {', '.join(known)}")
    if kind == "required":
        missing = next(k for k in constraint if k not in instance)
        return json_path((*path, missing)), "missing: this key is required"
    where, shown = json_path(path), show_value(instance)
    if "propertyNames" in error.schema_path:
        # jsonschema gives the object's path; the key itself is what is refused.
        where, shown = json_path((*path, instance)), f"the key {shown}"
    expected: dict[str, Callable[[], str]] = {
        "type": lambda: " or ".join(_TYPE_WORDS.get(t, t) for t in type_list(constraint)),
        "enum": lambda: "one of " + ", ".join(show_value(v) for v in constraint),
        "const": lambda: f"exactly {show_value(constraint)}",
        "pattern": lambda: PATTERN_WORDS.get(constraint, f"text matching /{constraint}/"),
        "minimum": lambda: _range(schema),
        "exclusiveMinimum": lambda: _range(schema),
        "maximum": lambda: _range(schema),
    }
    if kind in expected:
        return where, f"{shown} is not allowed: expected {expected[kind]()}"
    sizes = {"maxLength": "characters", "maxItems": "items", "maxProperties": "keys"}
    if kind in sizes:
        return where, (f"{len(instance)} {sizes[kind]} are too many: expected at most "
                       f"{constraint}")
    return where, f"{shown} is not allowed: {error.message}"


def _range(schema: Mapping[str, Any]) -> str:
    kind = "an integer" if "integer" in type_list(schema.get("type", [])) else "a number"
    high = _number(schema.get("maximum"))
    if "exclusiveMinimum" in schema:
        return f"{kind} above {_number(schema['exclusiveMinimum'])} and at most {high}"
    return f"{kind} from {_number(schema.get('minimum'))} to {high}"


def _number(value: object) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


#: Keys written as ``.key`` in a JSON path, as jsonschema's ``json_path`` does; others
#: as ``['key']`` so a hostile key cannot pass for a path.
_PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MAX_SHOWN = 80


def json_path(parts: Iterable[str | int]) -> str:
    """``parts`` (keys and indexes from the root) as a JSON path: ``$.outcomes[3].test_id``."""
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            path += f".{part}"
        else:
            path += f"[{show_value(part)}]"
    return path


def show_value(value: object) -> str:
    """A value for a message: strings as Python writes them, other values as JSON does."""
    if isinstance(value, str):
        text = repr(value[:_MAX_SHOWN + 1])
    elif isinstance(value, dict):
        text = f"an object of {len(value)} keys"
    elif isinstance(value, list | tuple):
        text = f"an array of {len(value)} items"
    elif isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        # str() of a huge int is slow, and refused past 4300 digits.
        text = f"an integer of {value.bit_length()} bits"
    else:
        try:
            text = json.dumps(value)
        except (TypeError, ValueError):
            text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."
