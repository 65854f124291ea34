"""RUN_SCHEMA compiled into a fast yes/no check of a ``run.json`` body.

jsonschema takes seconds over the tens of thousands of outcomes and figures of a big
run, and the store rebuilds every run it lists through the schema. So RUN_SCHEMA is
also compiled into plain closures that only answer yes or no; a no asks
:func:`harness.results.json_hazards.unrepresentable` and then jsonschema which value is
wrong. It must never say yes where either would say no (tests/test_run_schema.py holds
it to that): it refuses the parser's markers (a refused number, an object with a
repeated key) by their type, non-finite floats and lone surrogates itself, and cannot
meet deep nesting (it descends only where RUN_SCHEMA does, and no deeper than that).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from typing import Any, cast

from harness.results.json_hazards import is_utf8
from harness.results.run_schema import NO_NUL, RUN_SCHEMA, type_list

_Check = Callable[[object], bool]

#: Python types of parsed JSON, by JSON type. Exact types: a subclass (a StrEnum from
#: code) gets a no and so jsonschema's answer. bool is not int here, as in
#: run_validation's _is_integer.
_JSON_TYPES: dict[str, frozenset[type]] = {
    "string": frozenset({str}), "integer": frozenset({int}),
    "number": frozenset({int, float}), "array": frozenset({list, tuple}),
    "object": frozenset({dict}), "null": frozenset({type(None)}),
    "boolean": frozenset({bool}),
}
_ALL_TYPES = frozenset().union(*_JSON_TYPES.values())
#: Annotations the quick check may ignore; any other keyword not compiled below is an
#: error at import, so RUN_SCHEMA cannot grow a rule the quick check skips.
_IGNORED_KEYWORDS = frozenset({"$schema", "title", "description", "$comment"})
_COMPILED_KEYWORDS = frozenset({
    "type", "enum", "const", "maxLength", "pattern", "minimum", "exclusiveMinimum",
    "maximum", "maxItems", "items", "properties", "required", "additionalProperties",
    "maxProperties", "propertyNames"})


def _compile(schema: Mapping[str, Any]) -> _Check:
    """A yes/no check of ``schema``, for the keywords RUN_SCHEMA uses."""
    unknown = set(schema) - _COMPILED_KEYWORDS - _IGNORED_KEYWORDS
    if unknown:
        raise TypeError(f"RUN_SCHEMA uses {', '.join(sorted(unknown))}, which "
                        "schema_quick_check._compile does not check; add it there")
    types = (frozenset().union(*(_JSON_TYPES[t] for t in type_list(schema["type"])))
             if "type" in schema else _ALL_TYPES)
    # Exact values: 1.0 is no 1 and true no 1 here, where JSON equality may differ.
    choices = ([(type(c), c) for c in schema["enum"]] if "enum" in schema
               else [(type(schema["const"]), schema["const"])] if "const" in schema
               else None)
    text, number = _string_check(schema), _number_check(schema)
    array, obj = _array_check(schema), _object_check(schema)

    def check(value: object) -> bool:
        kind = type(value)
        if kind not in types:
            return False
        if choices is not None and (kind, value) not in choices:
            return False
        if kind is str:
            return text(value)
        if kind is float:
            return math.isfinite(cast(float, value)) and number(value)
        if kind is int:
            return number(value)
        if kind is list or kind is tuple:
            return array(value)
        if kind is dict:
            return obj(value)
        return True

    return check


def _string_check(schema: Mapping[str, Any]) -> _Check:
    longest = schema.get("maxLength")
    pattern = schema.get("pattern")
    # The same test as re.search(NO_NUL, ...), at the speed of a substring search.
    search = (None if pattern is None or pattern == NO_NUL
              else re.compile(pattern).search)
    no_nul = pattern == NO_NUL

    def check(value: object) -> bool:
        text = cast(str, value)
        return ((longest is None or len(text) <= longest)
                and (not no_nul or "\x00" not in text)
                and (search is None or search(text) is not None)
                and (text.isascii() or is_utf8(text)))

    return check


def _number_check(schema: Mapping[str, Any]) -> _Check:
    low, high = schema.get("minimum"), schema.get("maximum")
    above = schema.get("exclusiveMinimum")

    def check(value: object) -> bool:
        number = cast(float, value)
        return ((low is None or number >= low) and (above is None or number > above)
                and (high is None or number <= high))

    return check


def _array_check(schema: Mapping[str, Any]) -> _Check:
    most = schema.get("maxItems")
    item = _compile(schema["items"]) if "items" in schema else None

    def check(value: object) -> bool:
        items = cast(list[Any], value)
        if most is not None and len(items) > most:
            return False
        return item is None or all(map(item, items))

    return check


def _object_check(schema: Mapping[str, Any]) -> _Check:
    properties = {k: _compile(v) for k, v in schema.get("properties", {}).items()}
    required = list(schema.get("required", ()))
    extra = schema.get("additionalProperties", True)
    extra_check = None if isinstance(extra, bool) else _compile(extra)
    names = _compile(schema["propertyNames"]) if "propertyNames" in schema else None
    most = schema.get("maxProperties")

    def check(value: object) -> bool:
        body = cast(dict[str, Any], value)
        if most is not None and len(body) > most:
            return False
        if any(k not in body for k in required):
            return False
        for key, item in body.items():
            if names is not None and not names(key):
                return False
            known = properties.get(key)
            if known is not None:
                if not known(item):
                    return False
            elif extra is False or (extra_check is not None and not extra_check(item)):
                return False
        return True

    return check


#: Whether a run.json body certainly passes RUN_SCHEMA and the checks around it.
passes_quick_check = _compile(RUN_SCHEMA)
