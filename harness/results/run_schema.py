"""The run record's JSON Schema (``run.json``) and the one validated way to read it.

``run.json`` comes from CI runners the results service and ``harness store`` do not
control, so every reader goes through :func:`parse_run_json` (bytes or text) or
:func:`run_from_json` (an already parsed object), and every writer into the store
through :func:`check_run`. All three apply :data:`RUN_SCHEMA`; a refusal is a
:class:`RunRecordError` naming the JSON path of the first problem.

What a schema cannot say is checked around it: JSON text that is not UTF-8, numbers
JSON has no spelling for (NaN, Infinity, 1e999) or that are too long to convert
cheaply, duplicate keys, and nesting deep enough to exhaust the parser's stack.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, cast

from jsonschema import Draft202012Validator, validators
from jsonschema.exceptions import ValidationError

from harness.errors import HarnessError
from harness.results.model import (
    METRICS,
    RUN_SCHEMA_VERSION,
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    RunRecord,
    TestOutcome,
)

#: The largest ``run.json`` read: a suite of 10 000 tests writes a few MB.
MAX_DOCUMENT_BYTES = 64 * 1024 * 1024
#: Containers nested deeper than this are refused before parsing (run.json needs 4).
MAX_DEPTH = 32
#: Integers longer than this are refused before conversion (int() is quadratic in the
#: digits); 20 digits hold any 64-bit integer.
MAX_INT_DIGITS = 20

_FIX = ("write it with the harness's RunRecord.to_json (pytest --harness-run-record=PATH "
        "writes one)")

# Every string: PostgreSQL's text cannot hold NUL, and the two backends must accept
# the same runs. (Python's $ also matches before a final newline; harmless here.)
_NO_NUL = "^[^\\x00]*$"
# harness/service/layout.py's _RUN_ID: the id names the run's directory on the service.
# (?![\s\S]) rather than $, which in Python also matches before a final newline.
_RUN_ID = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}(?![\\s\\S])"
_PATTERN_WORDS = {
    _NO_NUL: "text without NUL characters",
    _RUN_ID: "1-128 letters, digits, '.', '-' or '_', starting with a letter or digit",
}

#: Ids and names (branch, host, build key); longer free text (a CPU's or GPU's name, a
#: version line); a pytest node id, which parametrisation makes long; a failure message.
_NAME_CHARS = 256
_TEXT_CHARS = 1024
_TEST_ID_CHARS = 4096
_MESSAGE_CHARS = 64 * 1024
#: Bounds on counts: far above a real run, low enough that one upload cannot fill the store.
_MAX_ITEMS = 200_000
_MAX_LABELS = 256
#: figures.n_prompt / n_gen are Integer columns: int32 on PostgreSQL. (vram_mib too,
#: which is 2 PiB.)
_MAX_INT32 = 2**31 - 1
#: No test takes longer than this (about 115 days) and no figure is larger.
_MAX_DURATION_S = 1e7
_MAX_FIGURE = 1e15

#: harness/ab's words, copied rather than imported (harness/ab builds on this package):
#: the designs of harness/ab/design.py's DESIGNS, the verdicts of harness/ab/decision.py.
#: tests/test_run_schema.py holds them equal.
AB_DESIGNS = ("interleaved", "duet")
AB_VERDICTS = ("regressed", "unchanged", "improved", "unknown")
#: harness ab's --threshold goes up to 0.5 (a 50 % change).
_MAX_AB_THRESHOLD = 0.5
#: Counters that changed between two builds: a few dozen in practice (one per buffer
#: and kind, a few from the completion).
_MAX_COUNTER_CHANGES = 1000


def _text(max_chars: int, *, nullable: bool = False) -> dict[str, Any]:
    return {"type": ["string", "null"] if nullable else "string",
            "maxLength": max_chars, "pattern": _NO_NUL}


def _object(required: Iterable[str], properties: dict[str, Any]) -> dict[str, Any]:
    # A closed set of keys: a typo'd field is an error, not a silently dropped value.
    return {"type": "object", "additionalProperties": False,
            "required": list(required), "properties": properties}


# A ratio of candidate to baseline (and its interval's bounds): null when too few pairs
# gave one, never 0 or below (both medians are positive speeds or times).
_AB_RATIO = {"type": ["number", "null"], "exclusiveMinimum": 0, "maximum": _MAX_FIGURE}

#: The run record's ``ab`` object, as harness/ab/report.py's record_json writes it.
_AB_SCHEMA = _object(
    ["baseline", "candidate", "design", "threshold", "metrics", "counter_changes"], {
        "baseline": _text(_TEXT_CHARS),
        "candidate": _text(_TEXT_CHARS),
        "design": {"enum": list(AB_DESIGNS)},
        "threshold": {"type": "number", "exclusiveMinimum": 0,
                      "maximum": _MAX_AB_THRESHOLD},
        # Keyed by metric name, only the metrics the harness defines.
        "metrics": {"type": "object", "additionalProperties": False, "properties": {
            name: _object(["verdict", "pairs", "ratio", "ci_low", "ci_high"], {
                "verdict": {"enum": list(AB_VERDICTS)},
                "pairs": {"type": "integer", "minimum": 0, "maximum": _MAX_INT32},
                "ratio": _AB_RATIO, "ci_low": _AB_RATIO, "ci_high": _AB_RATIO,
            }) for name in sorted(METRICS)}},
        "counter_changes": {"type": "array", "maxItems": _MAX_COUNTER_CHANGES,
                            "items": _object(["name", "baseline", "candidate"], {
                                "name": _text(_NAME_CHARS),
                                "baseline": _text(_TEST_ID_CHARS),
                                "candidate": _text(_TEST_ID_CHARS),
                            })},
    })


#: ``run.json`` as :meth:`RunRecord.to_json` writes it. A field added later is optional
#: here (older runs lack it) and is read in :func:`_build`.
RUN_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "title": "harness run record (run.json)",
    **_object(
        ["run_id", "branch", "commit", "started_at", "finished_at", "hardware", "build",
         "harness_version"],
        {
            "schema": {"const": RUN_SCHEMA_VERSION},
            "run_id": {"type": "string", "pattern": _RUN_ID},
            "branch": _text(_NAME_CHARS),
            "commit": _text(_NAME_CHARS),
            "started_at": _text(_NAME_CHARS),
            "finished_at": _text(_NAME_CHARS),
            "harness_version": _text(_NAME_CHARS),
            "hardware": _object(["host", "cpu"], {
                "host": _text(_NAME_CHARS),
                "cpu": _text(_TEXT_CHARS),
                "gpu": _text(_TEXT_CHARS),
                "gpu_driver": _text(_NAME_CHARS, nullable=True),
                "vram_mib": {"type": ["integer", "null"], "minimum": 0,
                             "maximum": _MAX_INT32},
            }),
            "build": _object(["backend", "version", "source_digest", "build_key"], {
                "backend": _text(_NAME_CHARS),
                "version": _text(_TEXT_CHARS),
                "source_digest": _text(_NAME_CHARS),
                "build_key": _text(_NAME_CHARS),
                "image_digest": _text(_NAME_CHARS, nullable=True),
            }),
            "outcomes": {"type": "array", "maxItems": _MAX_ITEMS, "items": _object(
                ["test_id", "outcome"], {
                    "test_id": _text(_TEST_ID_CHARS),
                    # harness/recording/outcomes.py's OutcomeTally writes these.
                    "outcome": {"enum": ["passed", "failed", "error", "skipped",
                                         "xfailed", "xpassed"]},
                    "duration_s": {"type": "number", "minimum": 0,
                                   "maximum": _MAX_DURATION_S},
                    "message": _text(_MESSAGE_CHARS, nullable=True),
                })},
            "figures": {"type": "array", "maxItems": _MAX_ITEMS, "items": _object(
                ["test_id", "key", "metric", "value"], {
                    "test_id": _text(_TEST_ID_CHARS),
                    "key": _object(
                        ["fixture", "backend", "gpu", "n_gpu_layers", "cache_type_k",
                         "cache_type_v", "flash_attn", "offload", "n_prompt", "n_gen"], {
                            "fixture": _text(_TEXT_CHARS),
                            "backend": _text(_NAME_CHARS),
                            "gpu": _text(_TEXT_CHARS),
                            "n_gpu_layers": _text(_NAME_CHARS),
                            "cache_type_k": _text(_NAME_CHARS),
                            "cache_type_v": _text(_NAME_CHARS),
                            "flash_attn": _text(_NAME_CHARS),
                            "offload": _text(_TEXT_CHARS),
                            "n_prompt": {"type": "integer", "minimum": 0,
                                         "maximum": _MAX_INT32},
                            "n_gen": {"type": "integer", "minimum": 0,
                                      "maximum": _MAX_INT32},
                        }),
                    # The recorder measures exactly these; a new metric is added there.
                    "metric": {"enum": sorted(METRICS)},
                    # Times, speeds and sizes: none is negative.
                    "value": {"type": "number", "minimum": 0, "maximum": _MAX_FIGURE},
                })},
            "labels": {"type": "object", "maxProperties": _MAX_LABELS,
                       "propertyNames": _text(_NAME_CHARS),
                       "additionalProperties": _text(_TEST_ID_CHARS)},
            "ab": _AB_SCHEMA,
        }),
}


class RunRecordError(HarnessError, ValueError):
    """A run record (``run.json`` or one built in code) that the schema refuses.

    A ValueError too, so callers of :meth:`RunRecord.from_json` that catch
    ``(KeyError, TypeError, ValueError)`` keep working.
    """

    def __init__(self, source: str, field: str, problem: str, fix: str = _FIX) -> None:
        #: JSON path of the refused value (``$.outcomes[3].test_id``; ``$`` for all of it).
        self.field = field
        #: What held the record: a file name, ``run.json``, ``run 'ID'``.
        self.source = source
        self.problem = problem
        self.fix = fix
        super().__init__(f"{source} is not a harness run record: {field}: {problem}; {fix}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.field, self.problem, self.fix))


# -- reading -------------------------------------------------------------------------


def parse_run_json(data: bytes | str, *, source: str = "run.json") -> RunRecord:
    """The run record in ``data`` (a whole ``run.json``), validated against the schema."""
    if len(data) > MAX_DOCUMENT_BYTES:
        unit = "characters" if isinstance(data, str) else "bytes"
        raise RunRecordError(source, "$", f"{len(data)} {unit} are too many: expected at "
                             f"most {MAX_DOCUMENT_BYTES} bytes")
    if isinstance(data, str):
        text = data
    else:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RunRecordError(source, "$", f"byte {exc.start} is not UTF-8: expected "
                                 "UTF-8 JSON text") from exc
    if _nested_too_deep(text):
        raise RunRecordError(source, "$", f"containers nested more than {MAX_DEPTH} deep "
                             "are not allowed")
    try:
        body = json.loads(text, parse_constant=_refuse_constant, parse_float=_float,
                          parse_int=_int, object_pairs_hook=_dict)
    except json.JSONDecodeError as exc:
        raise RunRecordError(source, "$", f"not valid JSON: {exc}") from exc
    except RecursionError as exc:  # pragma: no cover - _nested_too_deep comes first
        raise RunRecordError(source, "$", f"containers nested more than {MAX_DEPTH} deep "
                             "are not allowed") from exc
    return run_from_json(body, source=source)


def run_from_json(body: object, *, source: str = "run record") -> RunRecord:
    """The run record in an already parsed ``run.json`` body, validated against the schema."""
    _check(body, source)
    return _build(cast(Mapping[str, Any], body))


def check_run(run: RunRecord) -> None:
    """Raise :class:`RunRecordError` if ``run`` (maybe built in code) breaks the schema."""
    _check(run.to_json(), f"run {_show(run.run_id)}",
           fix="build it from what was measured: finite numbers, text without NUL")


def _build(body: Mapping[str, Any]) -> RunRecord:
    """A record from a body the schema accepted: every key is known, every type right."""
    return RunRecord(
        run_id=body["run_id"], branch=body["branch"], commit=body["commit"],
        started_at=body["started_at"], finished_at=body["finished_at"],
        hardware=Hardware(**body["hardware"]), build=BuildRef(**body["build"]),
        harness_version=body["harness_version"],
        outcomes=tuple(TestOutcome(test_id=o["test_id"], outcome=o["outcome"],
                                   duration_s=float(o.get("duration_s", 0.0)),
                                   message=o.get("message"))
                       for o in body.get("outcomes", ())),
        figures=tuple(Figure(test_id=f["test_id"], key=FigureKey(**f["key"]),
                             metric=f["metric"], value=float(f["value"]))
                      for f in body.get("figures", ())),
        labels=dict(body.get("labels", {})),
        ab=_ab(body["ab"]) if "ab" in body else None,
    )


def _ab(ab: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh copy of an accepted ``ab`` object, its numbers floats as record_json's are."""
    return {
        "baseline": ab["baseline"], "candidate": ab["candidate"], "design": ab["design"],
        "threshold": float(ab["threshold"]),
        "metrics": {name: {"verdict": m["verdict"], "pairs": m["pairs"],
                           **{k: None if m[k] is None else float(m[k])
                              for k in ("ratio", "ci_low", "ci_high")}}
                    for name, m in ab["metrics"].items()},
        "counter_changes": [{"name": c["name"], "baseline": c["baseline"],
                             "candidate": c["candidate"]} for c in ab["counter_changes"]],
    }


# -- what the schema cannot say ---------------------------------------------------------


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
    return _Refused(f"{_show(literal)} is not allowed: it overflows to infinity; expected a "
                    "finite number")


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


# Stripping escapes first leaves strings without backslashes, so matching them is
# linear: a hostile run of \" cannot make the string pattern backtrack.
_ESCAPE = re.compile(r"\\.", re.DOTALL)
_STRING = re.compile(r'"[^"]*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_EMPTY_PAIR = re.compile(r"\[\]|\{\}")


def _nested_too_deep(text: str) -> bool:
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


def _unrepresentable(body: object) -> tuple[str, str] | None:
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
            return _path(path), value.problem
        if isinstance(value, float) and not math.isfinite(value):
            return _path(path), f"{value} is not allowed: expected a finite number"
        if isinstance(value, str) and not value.isascii() and not _utf8(value):
            return _path(path), "a lone surrogate is not allowed: expected UTF-8 text"
        if not isinstance(value, dict | list | tuple):
            continue
        if len(path) >= MAX_DEPTH:
            return _path(path), (f"containers nested more than {MAX_DEPTH} deep are not "
                                 "allowed")
        if isinstance(value, _Duplicated):
            return _path((*path, value.duplicate)), "a repeated key is not allowed"
        items: Iterable[tuple[str | int, object]] = (
            value.items() if isinstance(value, dict) else enumerate(value))
        for key, item in reversed(list(items)):
            stack.append(((*path, key), item))
            if isinstance(key, str) and not key.isascii():
                # Popped before its value: a key's own problem comes first.
                stack.append(((*path, key), key))
    return None


# -- the schema and its messages --------------------------------------------------------


def _is_integer(_checker: object, instance: object) -> bool:
    # Exact: JSON true is no count, and 3.0 is no integer in what the harness writes.
    return isinstance(instance, int) and not isinstance(instance, bool)


def _is_number(_checker: object, instance: object) -> bool:
    # NaN passes every minimum and maximum, so non-finite floats are no numbers at all.
    return (_is_integer(_checker, instance)
            or (isinstance(instance, float) and math.isfinite(instance)))


def _is_array(_checker: object, instance: object) -> bool:
    # RunRecord.to_json keeps the record's tuples (dataclasses.asdict does).
    return isinstance(instance, list | tuple)


_TYPES = Draft202012Validator.TYPE_CHECKER.redefine_many({
    "integer": _is_integer, "number": _is_number, "array": _is_array})
# types-jsonschema leaves extend() untyped; it returns a Draft202012Validator subclass.
_RunValidator: type[Draft202012Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator, type_checker=_TYPES)
_VALIDATOR = _RunValidator(RUN_SCHEMA)


def _check(body: object, source: str, fix: str = _FIX) -> None:
    if _QUICK_CHECK(body):
        return
    found = _unrepresentable(body)
    if found is not None:
        raise RunRecordError(source, *found, fix=fix)
    # min(): the first by path, the same on every run, without sorting them all.
    error = min(_VALIDATOR.iter_errors(body),
                key=lambda e: (_path(e.absolute_path), str(e.validator), e.message),
                default=None)
    # None: the quick check is stricter than jsonschema in a corner (1.0 for 1), and
    # jsonschema has the last word.
    if error is not None:
        raise RunRecordError(source, *_describe(error), fix=fix)




_TYPE_WORDS = {"string": "a string", "integer": "an integer", "number": "a finite number",
               "object": "an object", "array": "an array", "null": "null",
               "boolean": "true or false"}


def _describe(error: ValidationError) -> tuple[str, str]:
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
        return _path((*path, extra)), (f"unknown key (value {_show(instance[extra])}) is "
                                       f"not allowed: expected one of {', '.join(known)}")
    if kind == "required":
        missing = next(k for k in constraint if k not in instance)
        return _path((*path, missing)), "missing: this key is required"
    where, shown = _path(path), _show(instance)
    if "propertyNames" in error.schema_path:
        # jsonschema gives the object's path; the key itself is what is refused.
        where, shown = _path((*path, instance)), f"the key {shown}"
    expected: dict[str, Callable[[], str]] = {
        "type": lambda: " or ".join(_TYPE_WORDS.get(t, t) for t in _listed(constraint)),
        "enum": lambda: "one of " + ", ".join(_show(v) for v in constraint),
        "const": lambda: f"exactly {_show(constraint)}",
        "pattern": lambda: _PATTERN_WORDS.get(constraint, f"text matching /{constraint}/"),
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


def _listed(types: str | list[str]) -> list[str]:
    return [types] if isinstance(types, str) else types


def _range(schema: Mapping[str, Any]) -> str:
    kind = "an integer" if "integer" in _listed(schema.get("type", [])) else "a number"
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


def _path(parts: Iterable[str | int]) -> str:
    path = "$"
    for part in parts:
        if isinstance(part, int):
            path += f"[{part}]"
        elif _PLAIN_KEY.fullmatch(part):
            path += f".{part}"
        else:
            path += f"[{_show(part)}]"
    return path


def _show(value: object) -> str:
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


# -- the quick check -------------------------------------------------------------------
#
# jsonschema takes seconds over the tens of thousands of outcomes and figures of a big
# run, and the store rebuilds every run it lists through the schema. So RUN_SCHEMA is
# also compiled into plain closures that only answer yes or no; a no asks
# _unrepresentable and then jsonschema which value is wrong. It must never say yes where
# either would say no (tests/test_run_schema.py holds it to that): it refuses the
# parser's _Refused values and _Duplicated objects by their type, non-finite floats and
# lone surrogates itself, and cannot meet deep nesting (it descends only where
# RUN_SCHEMA does, and no deeper than that).

_Check = Callable[[object], bool]

#: Python types of parsed JSON, by JSON type. Exact types: a subclass (a StrEnum from
#: code) gets a no and so jsonschema's answer. bool is not int here, as in _is_integer.
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
                        "run_schema._compile does not check; add it there")
    types = (frozenset().union(*(_JSON_TYPES[t] for t in _listed(schema["type"])))
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
    # The same test as re.search(_NO_NUL, ...), at the speed of a substring search.
    search = (None if pattern is None or pattern == _NO_NUL
              else re.compile(pattern).search)
    no_nul = pattern == _NO_NUL

    def check(value: object) -> bool:
        text = cast(str, value)
        return ((longest is None or len(text) <= longest)
                and (not no_nul or "\x00" not in text)
                and (search is None or search(text) is not None)
                and (text.isascii() or _utf8(text)))

    return check


def _utf8(text: str) -> bool:
    """Whether ``text`` has no lone surrogate (which UTF-8 cannot encode)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


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


_QUICK_CHECK = _compile(RUN_SCHEMA)
