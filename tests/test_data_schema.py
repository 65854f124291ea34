"""harness/data_schema: one way to read a data file, and the words of its refusals.

The formats' own tests (test_modelgen_specs, test_bundles, test_flakes, test_source,
test_build_record, test_gpu_configs) check each file's messages; here are the shared
rules (one line per problem, sorted, said once, the fix last), the schemas under
``resources/schemas/`` themselves, and the one format without a test file of its own: an older
results service's ``report-state.json``.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from harness.data_schema import (
    SCHEMA_DIR,
    check,
    describe,
    join_path,
    load_json,
    problem,
    problems,
    read_json,
    schema_file,
    show,
)
from harness.errors import ConfigError, FixtureError, HarnessError
from harness.service.reports import _legacy_state

SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "size"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z]+$", "x-allowed": "a lowercase word"},
        "size": {"type": "number", "exclusiveMinimum": 0},
        "kind": {"enum": ["a", "b"]},
    },
    "allOf": [{
        "if": {"required": ["kind"], "properties": {"kind": {"const": "b"}}},
        "then": {"description": "kind b needs a colour", "required": ["colour"]},
    }],
}


def _schema(tmp_path: Path, schema: dict[str, Any] = SCHEMA) -> Path:
    path = tmp_path / "thing.schema.json"
    path.write_text(json.dumps(schema), encoding="utf-8")
    return path


def test_every_problem_is_one_line_sorted_by_path_with_the_fix_last(tmp_path: Path) -> None:
    schema = _schema(tmp_path)
    with pytest.raises(ConfigError) as info:
        check({"name": "Big", "size": 0, "kind": "b", "extra": True}, schema, "thing.json",
              ConfigError, fix="see the README")
    assert str(info.value).splitlines() == [
        "thing.json: $.colour: missing required key; allowed: any value (kind b needs a colour)",
        "thing.json: $.extra: unknown key (value true) is not allowed; allowed keys: kind, "
        "name, size",
        "thing.json: $.name: \"Big\" is not allowed: 'Big' does not match '^[a-z]+$'; allowed: "
        "type string, matching /^[a-z]+$/ (a lowercase word)",
        "thing.json: $.size: 0 is not allowed: 0 is less than or equal to the minimum of 0; "
        "allowed: type number, > 0",
        "see the README",
    ]
    assert problems({"name": "ok", "size": 1}, schema, "thing.json", ConfigError) == []


def test_the_callers_error_class_is_raised(tmp_path: Path) -> None:
    data = tmp_path / "thing.json"
    data.write_text('{"name": "ok"}', encoding="utf-8")
    with pytest.raises(FixtureError, match=r"thing\.json: \$\.size: missing required key"):
        load_json(data, _schema(tmp_path), FixtureError)
    assert load_json(data, _schema(tmp_path, {"type": "object"}), FixtureError) == {"name": "ok"}


@pytest.mark.parametrize(("text", "words"), [
    ("{", "not valid JSON: Expecting property name"),
    ('{"size": Infinity}', "not valid JSON: Infinity is not a JSON number"),
    ('{"size": -Infinity}', "not valid JSON: -Infinity is not a JSON number"),
])
def test_text_that_is_no_json_is_named(tmp_path: Path, text: str, words: str) -> None:
    path = tmp_path / "thing.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        read_json(path, ConfigError, fix="write JSON")
    assert str(info.value).startswith(f"{path}: {words}")
    assert str(info.value).endswith("\nwrite JSON")


def test_unreadable_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.json: cannot read the file: No such file"):
        read_json(tmp_path / "nope.json", ConfigError)
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"name": "\xe9"}')
    with pytest.raises(ConfigError, match=r"latin1\.json: not UTF-8 text \(byte 10\)"):
        read_json(path, ConfigError)


def test_data_not_from_json_text_is_checked_alike(tmp_path: Path) -> None:
    # YAML can hold .nan, which passes every bound; it is no number here.
    with pytest.raises(ConfigError, match=r"\$\.size: NaN is not allowed"):
        check({"name": "ok", "size": float("nan")}, _schema(tmp_path), "f.yaml", ConfigError)


def test_a_broken_schema_is_the_callers_error(tmp_path: Path) -> None:
    schema = _schema(tmp_path, {"type": "thing"})
    with pytest.raises(ConfigError, match=r"thing\.schema\.json: not a valid JSON schema"):
        check({}, schema, "data.json", ConfigError)


def test_the_words_for_paths_values_and_constraints() -> None:
    assert join_path("$", "name") == "$.name"
    assert join_path("$.a", "eliza-1-2b") == "$.a['eliza-1-2b']"
    assert join_path("$.a", "it's") == "$.a['it\\'s']"
    assert join_path("$.types", 3) == "$.types[3]"
    assert show("x" * 100) == '"' + "x" * 76 + "..."
    assert show(b"raw") == "b'raw'"
    assert describe({"type": ["string", "null"], "minLength": 1}, {}) == (
        "type string or null, length >= 1")
    root = {"$defs": {"n": {"type": "integer", "minimum": 1}}}
    assert describe({"$ref": "#/$defs/n", "x-allowed": "a count"}, root) == (
        "type integer, >= 1 (a count)")
    assert describe({"x-allowed": "any word"}, {}) == "any word"
    assert problem("f.json", "$.head_count", 3, "not a multiple of 2", "a multiple of 2") == (
        "f.json: $.head_count: 3 is not allowed: not a multiple of 2; allowed: a multiple of 2")


@pytest.mark.parametrize("path", sorted(SCHEMA_DIR.glob("*.schema.json")),
                         ids=lambda p: p.name)
def test_every_schema_in_the_folder_is_a_documented_2020_12_schema(path: Path) -> None:
    schema = json.loads(path.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith(f"/schemas/{path.name}")
    assert schema["title"]
    # A reader of the schema finds the code that reads the format.
    assert re.search(r"harness/\S+\.py", schema["description"]), schema["description"]
    assert schema_file(path.name.removesuffix(".schema.json")) == path


def test_an_older_services_report_state_is_read(tmp_path: Path) -> None:
    path = tmp_path / "report-state.json"
    path.write_text(json.dumps({"state": "ready", "message": None, "problems": ["kept"],
                                "queued_ns": 7, "written_by": "v1"}), encoding="utf-8")
    state = _legacy_state(path)
    assert state is not None
    assert (state.state, state.problems, state.queued_ns) == ("ready", ("kept",), 7)


def test_a_bad_report_state_is_logged_with_the_key_and_allowed_values(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "report-state.json"
    path.write_text(json.dumps({"state": "done", "queued_ns": -1}), encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="harness.service.reports"):
        assert _legacy_state(path) is None
    text = caplog.text
    assert (f'{path}: $.queued_ns: -1 is not allowed: -1 is less than the minimum of 0; '
            "allowed: type integer, >= 0, <= 9223372036854775807") in text
    assert (f'{path}: $.state: "done" is not allowed: \'done\' is not one of '
            "['pending', 'ready', 'failed']; allowed: one of \"pending\", \"ready\", "
            '"failed"') in text
    assert "the run's report is made again" in text


def test_harness_error_is_the_base_of_what_is_raised(tmp_path: Path) -> None:
    with pytest.raises(HarnessError):
        read_json(tmp_path / "missing.json", HarnessError)
