"""How a schema's refusal is put in words: one line per problem, the same for every file.

A line reads ``FILE: $.key.path: VALUE is not allowed: WHY; allowed: WHAT``: the file,
the JSON path of the refused value (as jsonschema's ``json_path`` spells it), the value
cut short, jsonschema's reason, and what the schema allows there, in words. A refusal
from an ``if``/``then``/``else`` rule ends with that branch's ``description`` in
brackets, so the rule a file broke is named with the fix.

Pure: no files, no jsonschema validator, only a :class:`ValidationError` and the root
schema it came from.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, cast

from jsonschema.exceptions import ValidationError

_MAX_VALUE_CHARS = 80
#: Keys jsonschema writes as ``.key`` in a JSON path; others become ``['key']``.
_PLAIN_KEY = re.compile(r"^[a-zA-Z][a-zA-Z0-9_]*$")
#: A schema's own words for what it allows, where the constraints alone would say too
#: little (a pattern, a format): ``"x-allowed": "a link to the issue (https://...)"``.
ALLOWED_KEYWORD = "x-allowed"
_BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
           ("exclusiveMaximum", "<"), ("multipleOf", "a multiple of"),
           ("minLength", "length >="), ("maxLength", "length <="), ("minItems", "items >="),
           ("maxItems", "items <="), ("minProperties", "keys >="))


def problem(source: object, where: str, value: object, why: str, allowed: str) -> str:
    """One line in the schema's words, for a check the schema cannot state (in code)."""
    return f"{source}: {where}: {show(value)} is not allowed: {why}; allowed: {allowed}"


def messages(source: object, root: Mapping[str, Any], error: ValidationError) -> list[str]:
    """The lines for one jsonschema error: the file, JSON path, value and what is allowed."""
    where = error.json_path
    schema = cast(Mapping[str, Any], error.schema)
    # jsonschema types these as "maybe unset"; on an error from iter_errors they are set.
    instance: Any = error.instance
    constraint: Any = error.validator_value
    nodes = _walk(root, error.relative_schema_path)
    rule = _rule(nodes)
    if error.validator == "additionalProperties":
        known = sorted(_properties(root, schema))
        extra = [k for k in instance if k not in known]
        return [f"{source}: {join_path(where, key)}: unknown key (value {show(instance[key])}) "
                f"is not allowed; allowed keys: {', '.join(known)}" for key in extra]
    if error.validator == "required":
        missing = [k for k in constraint if k not in instance]
        return [f"{source}: {join_path(where, key)}: missing required key; allowed: "
                f"{_allowed_for(root, nodes, key)}{rule}" for key in missing]
    if error.validator == "dependentRequired":
        return [f"{source}: {join_path(where, needed)}: missing required key: {key!r} needs "
                f"it; allowed: {_allowed_for(root, nodes, needed)}{rule}"
                for key, needs in constraint.items() if key in instance
                for needed in needs if needed not in instance]
    if "propertyNames" in error.relative_schema_path:
        return [f"{source}: {where}: key {show(instance)} is not allowed: {error.message}; "
                f"allowed: keys {describe(schema, root)}{rule}"]
    if error.validator == "not":
        forbidden = _required_in(constraint)
        present = [k for k in forbidden if isinstance(instance, Mapping) and k in instance]
        return [f"{source}: {join_path(where, key)}: {show(instance[key])} is not allowed; "
                f"allowed: no {key!r} key{rule}" for key in present] or [
                f"{source}: {where}: not allowed here{rule}"]
    return [f"{source}: {where}: {show(instance)} is not allowed: {error.message}; "
            f"allowed: {describe(schema, root)}{rule}"]


def describe(schema: Mapping[str, Any], root: Mapping[str, Any]) -> str:
    """The constraints a subschema states, in words (with its own words, if it has any)."""
    if "$ref" in schema:
        schema = {**_resolve(root, schema["$ref"]),
                  **{k: v for k, v in schema.items() if k != "$ref"}}
    words: list[str] = []
    if "const" in schema:
        words.append(f"exactly {json.dumps(schema['const'])}")
    if "enum" in schema:
        words.append("one of " + ", ".join(json.dumps(v) for v in schema["enum"]))
    if "type" in schema:
        kinds = schema["type"]
        words.append("type " + (kinds if isinstance(kinds, str) else " or ".join(kinds)))
    words += [f"{word} {schema[key]}" for key, word in _BOUNDS if key in schema]
    if "pattern" in schema:
        words.append(f"matching /{schema['pattern']}/")
    if schema.get("uniqueItems"):
        words.append("no repeated items")
    if "format" in schema:
        words.append(f"a valid {schema['format']}")
    if "items" in schema and isinstance(schema["items"], Mapping):
        inner = describe(schema["items"], root)
        if inner:
            words.append(f"items: {inner}")
    if "additionalProperties" in schema and isinstance(schema["additionalProperties"], Mapping):
        inner = describe(schema["additionalProperties"], root)
        if inner:
            words.append(f"values: {inner}")
    if "propertyNames" in schema:
        words.append(describe(schema["propertyNames"], root))
    text = ", ".join(w for w in words if w)
    own = schema.get(ALLOWED_KEYWORD)
    if own:
        return f"{text} ({own})" if text else str(own)
    return text


def join_path(where: str, key: str | int) -> str:
    """``where`` and one more key or index, spelled as jsonschema's ``json_path`` does."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    if _PLAIN_KEY.match(key):
        return f"{where}.{key}"
    escaped = key.replace("\\", "\\\\").replace("'", "\\'")
    return f"{where}['{escaped}']"


def show(value: Any) -> str:
    """A value for a message: as JSON writes it, cut short."""
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        # Data parsed from YAML may hold what JSON cannot (bytes, a set).
        text = repr(value)
    return text if len(text) <= _MAX_VALUE_CHARS else text[: _MAX_VALUE_CHARS - 3] + "..."


# --- finding the schema around an error ------------------------------------------------


def _walk(root: Mapping[str, Any], schema_path: Iterable[str | int]) -> list[tuple[Any, Any]]:
    """(the step, the subschema it reached) from the root along an error's schema path.

    jsonschema leaves ``$ref`` (and ``if``) out of the path, so a step that is not in a
    node with a ``$ref`` continues in the schema the ``$ref`` names.
    """
    node: Any = root
    visited: list[tuple[Any, Any]] = [(None, root)]
    for part in schema_path:
        if isinstance(node, Mapping):
            followed: set[int] = set()
            # A $ref chain is followed once: a schema referring to itself ends the walk.
            while (part not in node and isinstance(node.get("$ref"), str)
                   and id(node) not in followed):
                followed.add(id(node))
                node = _resolve(root, node["$ref"])
                visited.append(("$ref", node))
            if part not in node:
                break
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node = node[part]
        else:
            break
        visited.append((part, node))
    return visited


def _rule(nodes: list[tuple[Any, Any]]) -> str:
    """The description of the innermost ``then``/``else`` branch an error came from."""
    for part, node in reversed(nodes):
        if part in ("then", "else") and isinstance(node, Mapping) and "description" in node:
            return f" ({node['description']})"
    return ""


def _allowed_for(root: Mapping[str, Any], nodes: list[tuple[Any, Any]], key: str) -> str:
    """What the innermost schema around an error that declares ``key`` allows for it."""
    for _, node in reversed(nodes):
        if isinstance(node, Mapping):
            props = _properties(root, node)
            if key in props:
                return describe(props[key], root) or "any value"
    return "any value"


def _properties(root: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any]:
    """The ``properties`` a (sub)schema declares, following a local ``$ref``."""
    if "properties" in schema:
        props: Mapping[str, Any] = schema["properties"]
        return props
    if isinstance(schema.get("$ref"), str):
        return _properties(root, _resolve(root, schema["$ref"]))
    return {}


def _resolve(root: Mapping[str, Any], ref: str) -> Mapping[str, Any]:
    """A local ``$ref`` (``#/$defs/name``): the harness's schemas refer to nothing else."""
    node: Any = root
    try:
        for part in ref.removeprefix("#").strip("/").split("/"):
            if part:
                node = node[part.replace("~1", "/").replace("~0", "~")]
    except (KeyError, IndexError, TypeError):
        # Another file's schema: the words come from what this one says.
        return {}
    resolved: Mapping[str, Any] = node if isinstance(node, Mapping) else {}
    return resolved


def _required_in(schema: Any) -> list[str]:
    """Keys a ``not`` subschema forbids: its ``required`` lists, also inside ``anyOf``."""
    keys: list[str] = list(schema.get("required", []))
    for branch in schema.get("anyOf", []):
        keys += _required_in(branch)
    return keys
