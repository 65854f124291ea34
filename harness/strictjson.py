"""Strict reading of the harness's JSON data files: objects with a closed set of keys.

Every error names the file, the key and what was expected, so a typo in a spec is
fixed from the message alone (DESIGN style rule 6).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from harness.errors import FixtureError, HarnessError


def read_object(path: Path, error: type[HarnessError] = FixtureError) -> dict[str, Any]:
    """The JSON object in ``path``; anything else (missing, malformed, a list) is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise error(f"{path}: cannot read data file: {exc}") from exc
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise error(f"{path}: expected a JSON object at the top level")
    return value


def check_keys(
    path: Path, obj: Mapping[str, Any], required: Collection[str], optional: Collection[str],
    error: type[HarnessError] = FixtureError,
) -> None:
    """Reject unknown keys and report missing ones, naming the allowed set."""
    allowed = sorted({*required, *optional})
    for key in obj:
        if key not in allowed:
            raise error(f"{path}: unknown key {key!r}; allowed keys: {', '.join(allowed)}")
    for key in sorted(required):
        if key not in obj:
            raise error(f"{path}: missing required key {key!r}")


def get_str(path: Path, obj: Mapping[str, Any], key: str) -> str:
    value = obj[key]
    if not isinstance(value, str) or not value:
        raise FixtureError(f"{path}: {key!r} must be a non-empty string, got {value!r}")
    return value


def get_opt_str(path: Path, obj: Mapping[str, Any], key: str) -> str | None:
    if obj.get(key) is None:
        return None
    return get_str(path, obj, key)


def get_int(
    path: Path, obj: Mapping[str, Any], key: str, *, default: int | None = None, minimum: int = 0
) -> int:
    value = obj.get(key, default)
    # bool is an int subclass in Python; a JSON true is never a count.
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise FixtureError(f"{path}: {key!r} must be an integer >= {minimum}, got {value!r}")
    return value


def get_opt_int(path: Path, obj: Mapping[str, Any], key: str, *, minimum: int = 0) -> int | None:
    if obj.get(key) is None:
        return None
    return get_int(path, obj, key, minimum=minimum)


def get_fraction(path: Path, obj: Mapping[str, Any], key: str) -> float:
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise FixtureError(f"{path}: {key!r} must be a number strictly between 0 and 1")
    return float(value)


def get_choice(path: Path, obj: Mapping[str, Any], key: str, choices: Collection[str]) -> str:
    value = get_str(path, obj, key)
    if value not in choices:
        raise FixtureError(
            f"{path}: {key!r} is {value!r}; allowed values: {', '.join(sorted(choices))}"
        )
    return value


def get_str_list(path: Path, obj: Mapping[str, Any], key: str) -> tuple[str, ...]:
    value = obj.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise FixtureError(f"{path}: {key!r} must be a list of non-empty strings")
    return tuple(value)
