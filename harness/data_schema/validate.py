"""Reading a data file and checking it against its JSON Schema (draft 2020-12).

Every problem in a file is reported at once, one line each (harness/data_schema/
messages.py says how), sorted by JSON path, with the caller's fix on a last line; the
error raised is the caller's own :class:`HarnessError` subclass, so each loader keeps
the error its callers catch.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn, cast

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import SchemaError

from harness.data_schema.messages import messages
from harness.errors import HarnessError
from harness.resources import resource_path

#: The schemas of the formats whose data is not a folder of its own in the package data
#: (GPU configs and KV types keep theirs beside them: configs/gpu/).
SCHEMA_DIR = resource_path("schemas")


def schema_file(name: str) -> Path:
    """``harness/resources/schemas/NAME.schema.json`` in the package data."""
    return SCHEMA_DIR / f"{name}.schema.json"


def read_json(path: Path, error: type[HarnessError], *, fix: str = "") -> Any:
    """The JSON value in ``path``; unreadable or malformed text raises ``error``."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        fail(error, [f"{path}: cannot read the file: {exc.strerror or exc}"], fix)
    except UnicodeDecodeError as exc:
        fail(error, [f"{path}: not UTF-8 text (byte {exc.start})"], fix)
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except ValueError as exc:  # json.JSONDecodeError is one
        fail(error, [f"{path}: not valid JSON: {exc}"], fix)


def load_json(path: Path, schema: Path, error: type[HarnessError], *, fix: str = "") -> Any:
    """The JSON value in ``path``, checked against ``schema``; any problem raises ``error``."""
    data = read_json(path, error, fix=fix)
    check(data, schema, path, error, fix=fix)
    return data


def check(data: object, schema: Path, source: object, error: type[HarnessError], *,
          fix: str = "") -> None:
    """Raise ``error`` naming every problem when ``data`` (read from ``source``) breaks
    ``schema``. For data that was not JSON text (YAML parsed to data, a file's fields)."""
    lines = problems(data, schema, source, error)
    if lines:
        fail(error, lines, fix)


def problems(data: object, schema: Path, source: object,
             error: type[HarnessError]) -> list[str]:
    """Every problem of ``data`` under ``schema``, one line each, sorted by JSON path."""
    validator = _validator_or(schema, error)
    root = cast(Mapping[str, Any], validator.schema)
    lines: list[str] = []
    for found in sorted(validator.iter_errors(data), key=lambda e: (e.json_path, e.message)):
        for line in messages(source, root, found):
            # One problem can break a rule twice (a value a $ref'd schema and a branch
            # refuse alike); it is said once.
            if line not in lines:
                lines.append(line)
    return lines


def fail(error: type[HarnessError], lines: Sequence[str], fix: str = "") -> NoReturn:
    """Raise ``error`` with ``lines`` and, last, the fix."""
    raise error("\n".join([*lines, fix] if fix else lines))


def fail_if_any(error: type[HarnessError], lines: Sequence[str], fix: str = "") -> None:
    """:func:`fail` when there is a problem: for checks made in code, all at once."""
    if lines:
        fail(error, lines, fix)


# --- the validators ----------------------------------------------------------------------


def _refuse_constant(name: str) -> float:
    # json.loads takes NaN and Infinity, which pass every minimum and maximum.
    raise ValueError(f"{name} is not a JSON number")


def _is_number(checker: object, instance: object) -> bool:
    # Data parsed from YAML can hold .nan and .inf, which no bound refuses either.
    return (Draft202012Validator.TYPE_CHECKER.is_type(instance, "number")
            and not (isinstance(instance, float) and not math.isfinite(instance)))


_TYPES = Draft202012Validator.TYPE_CHECKER.redefine("number", _is_number)
# types-jsonschema leaves extend() untyped; it returns a Draft202012Validator subclass.
_Validator: type[Draft202012Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, type_checker=_TYPES)


class _BadSchema(Exception):
    """A schema file that cannot be used; the caller's error class says it."""


def _validator_or(schema: Path, error: type[HarnessError]) -> Draft202012Validator:
    try:
        stat = schema.stat()
        # Keyed by the file's size and time too: a schema edited (or a test's rewritten)
        # while the process runs is read again.
        return _validator(schema, stat.st_size, stat.st_mtime_ns)
    except OSError as exc:
        raise error(f"{schema}: cannot read the JSON schema: {exc.strerror or exc}") from None
    except _BadSchema as exc:
        raise error(str(exc)) from None


@functools.cache
def _validator(schema: Path, _size: int, _mtime_ns: int) -> Draft202012Validator:
    # Cached: a folder of specs is checked against one schema, read and checked once.
    try:
        body = json.loads(schema.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _BadSchema(f"{schema}: cannot read the JSON schema: {exc}") from exc
    try:
        _Validator.check_schema(body)
    except SchemaError as exc:
        raise _BadSchema(f"{schema}: not a valid JSON schema: {exc.message}") from exc
    # The format checker makes "format": "regex" refuse a pattern re cannot compile, and
    # "format": "date" a day that does not exist.
    return _Validator(body, format_checker=Draft202012Validator.FORMAT_CHECKER)
