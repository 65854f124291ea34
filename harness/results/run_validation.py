"""The one validated way to read a run record, and to check one before it is stored.

``run.json`` comes from CI runners the results service and ``harness store`` do not
control, so every reader goes through :func:`parse_run_json` (bytes or text) or
:func:`run_from_json` (an already parsed object), and every writer into the store
through :func:`check_run`. All three apply RUN_SCHEMA (harness/results/run_schema.py)
and the checks around it (harness/results/json_hazards.py), asking the quick check
first; a refusal is a :class:`RunRecordError` naming the JSON path of the first problem.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

from jsonschema import Draft202012Validator, validators

from harness.errors import HarnessError
from harness.files import write_json_atomic
from harness.results.json_hazards import load_json, nested_too_deep, unrepresentable
from harness.results.run_record import (
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    Outcome,
    RunRecord,
    TestOutcome,
)
from harness.results.run_schema import MAX_DEPTH, MAX_DOCUMENT_BYTES, RUN_SCHEMA
from harness.results.schema_messages import describe, json_path, show_value
from harness.results.schema_quick_check import passes_quick_check
from harness.results.test_ids import current_test_id

_FIX = ("write it with the harness's RunRecord.to_json (pytest --harness-run-record=PATH "
        "writes one)")


class RunRecordError(HarnessError, ValueError):
    """A run record (``run.json`` or one built in code) that the schema refuses.

    A ValueError too, so callers of :func:`run_from_json` that catch
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
    if nested_too_deep(text):
        raise RunRecordError(source, "$", f"containers nested more than {MAX_DEPTH} deep "
                             "are not allowed")
    try:
        body = load_json(text)
    except json.JSONDecodeError as exc:
        raise RunRecordError(source, "$", f"not valid JSON: {exc}") from exc
    except RecursionError as exc:  # pragma: no cover - nested_too_deep comes first
        raise RunRecordError(source, "$", f"containers nested more than {MAX_DEPTH} deep "
                             "are not allowed") from exc
    return run_from_json(body, source=source)


def run_from_json(body: object, *, source: str = "run record") -> RunRecord:
    """The run record in an already parsed ``run.json`` body, validated against the schema."""
    _check(body, source)
    return _build(cast(Mapping[str, Any], body))


def run_from_checked_json(body: Mapping[str, Any]) -> RunRecord:
    """The run record in a body that passed the schema before, built without checking again.

    Only for what the store wrote after :func:`check_run` said yes (its ``runs.checked``
    rows): checking every stored run again on every read is what made listings slow.
    """
    return _build(body)


def check_run(run: RunRecord) -> None:
    """Raise :class:`RunRecordError` if ``run`` (maybe built in code) breaks the schema."""
    _check(run.to_json(), f"run {show_value(run.run_id)}",
           fix="build it from what was measured: finite numbers, text without NUL")


def _build(body: Mapping[str, Any]) -> RunRecord:
    """A record from a body the schema accepted: every key is known, every type right.

    Test ids from before the suites moved read as they are named now (test_ids.py): this
    is the one place a stored, uploaded or written record becomes a RunRecord.
    """
    return RunRecord(
        run_id=body["run_id"], branch=body["branch"], commit=body["commit"],
        started_at=body["started_at"], finished_at=body["finished_at"],
        hardware=Hardware(**body["hardware"]), build=BuildRef(**body["build"]),
        harness_version=body["harness_version"],
        outcomes=tuple(TestOutcome(test_id=current_test_id(o["test_id"]),
                                   outcome=Outcome(o["outcome"]),
                                   duration_s=float(o.get("duration_s", 0.0)),
                                   message=o.get("message"))
                       for o in body.get("outcomes", ())),
        figures=tuple(Figure(test_id=current_test_id(f["test_id"]), key=FigureKey(**f["key"]),
                             metric=f["metric"], value=float(f["value"]),
                             predicted=float(f["predicted"]) if "predicted" in f else None)
                      for f in body.get("figures", ())),
        labels=dict(body.get("labels", {})),
        ab=_ab(body["ab"]) if "ab" in body else None,
        bisect=_bisect(body["bisect"]) if "bisect" in body else None,
        # Plain JSON the schema closed key by key: a deep copy is all it needs.
        tune=json.loads(json.dumps(body["tune"])) if "tune" in body else None,
        numerics=json.loads(json.dumps(body["numerics"])) if "numerics" in body else None,
    )


def _commit(commit: Mapping[str, Any] | None) -> dict[str, str] | None:
    return None if commit is None else {"sha": commit["sha"], "subject": commit["subject"]}


def _bisect(bisect: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh copy of an accepted ``bisect`` object, its seconds floats."""
    return {
        "good": bisect["good"], "bad": bisect["bad"], "oracle": bisect["oracle"],
        "commits": bisect["commits"], "reproduced": bisect["reproduced"],
        "first_bad": _commit(bisect["first_bad"]),
        "candidates": [_commit(c) for c in bisect["candidates"]],
        "stopped": bisect.get("stopped"),
        "probes": [{**{k: p[k] for k in ("commit", "subject", "verdict", "evidence",
                                         "build_key", "cache_hit")},
                    "build_s": float(p["build_s"]), "judge_s": float(p["judge_s"]),
                    **{k: float(p[k]) for k in ("ratio", "ci_low", "ci_high") if k in p}}
                   for p in bisect["probes"]],
    }


def _ab(ab: Mapping[str, Any]) -> dict[str, Any]:
    """A fresh copy of an accepted ``ab`` object, its numbers floats as record_json's are.

    The optional fields are kept where the record has them (a record written before
    they existed has none): each metric's ``reason`` and ``would_decide``, the
    ``undecided`` metrics and the ``numerics`` verdict, which `harness compare` and the
    dashboard read from the stored run."""
    copied = {
        "baseline": ab["baseline"], "candidate": ab["candidate"], "design": ab["design"],
        "threshold": float(ab["threshold"]),
        "metrics": {name: {"verdict": m["verdict"], "pairs": m["pairs"],
                           **{k: None if m[k] is None else float(m[k])
                              for k in ("ratio", "ci_low", "ci_high")},
                           **{k: m[k] for k in ("reason", "would_decide") if k in m}}
                    for name, m in ab["metrics"].items()},
        "counter_changes": [{"name": c["name"], "baseline": c["baseline"],
                             "candidate": c["candidate"]} for c in ab["counter_changes"]],
    }
    if "undecided" in ab:
        copied["undecided"] = list(ab["undecided"])
    if "numerics" in ab:
        # Plain JSON the schema closed key by key: a deep copy is all it needs.
        copied["numerics"] = json.loads(json.dumps(ab["numerics"]))
    return copied


def with_bisect(run: RunRecord, body: bytes, *, source: str) -> RunRecord:
    """``run`` with the bisect object ``body`` (JSON bytes, hostile) as its ``bisect``.

    The bisect goes through the whole run.json parser, inside the stored run's own
    document, so it meets every limit a run.json meets; the result must be ``run``
    unchanged but for its bisect, so no text in ``body`` can reach another field.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunRecordError(source, "$.bisect", f"is not UTF-8 text ({exc.reason})") from None
    document = json.dumps({k: v for k, v in run.to_json().items() if k != "bisect"})
    combined = parse_run_json(f'{{"bisect": {text}, {document[1:]}', source=source)
    if combined.bisect is None or replace(combined, bisect=None) != replace(run, bisect=None):
        raise RunRecordError(source, "$.bisect", "is not one bisect object")
    return combined


def add_to_run(run_json: Path, key: str, value: dict[str, Any], *,
               what: str) -> dict[str, Any] | None:
    """Add ``value`` as ``key`` of the run record at ``run_json`` (an A/B result, a
    bisect), through the run.json schema both ways: a file that is not a run record, or
    a value the schema refuses, is an error and the file is left as it was.

    A ``key`` already there is replaced whole; returns what it held (as parsed), None
    when it was new, so a caller can say it replaced one (the gate's rerun of an
    undecided A/B records its second result over its first)."""
    body = parse_run_json(run_json.read_bytes(), source=str(run_json)).to_json()
    replaced: dict[str, Any] | None = body.get(key)
    body[key] = value
    parse_run_json(json.dumps(body), source=f"{run_json} with {what}")
    write_json_atomic(run_json, body)
    return replaced


# -- the schema's validator ------------------------------------------------------------


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
#: jsonschema's validator of RUN_SCHEMA, with JSON's types as the harness writes them.
RUN_VALIDATOR = _RunValidator(RUN_SCHEMA)


def _check(body: object, source: str, fix: str = _FIX) -> None:
    if passes_quick_check(body):
        return
    found = unrepresentable(body)
    if found is not None:
        raise RunRecordError(source, *found, fix=fix)
    # min(): the first by path, the same on every run, without sorting them all.
    error = min(RUN_VALIDATOR.iter_errors(body),
                key=lambda e: (json_path(e.absolute_path), str(e.validator), e.message),
                default=None)
    # None: the quick check is stricter than jsonschema in a corner (1.0 for 1), and
    # jsonschema has the last word.
    if error is not None:
        raise RunRecordError(source, *describe(error), fix=fix)
