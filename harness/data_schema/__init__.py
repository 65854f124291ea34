"""The one way the harness reads a data file: JSON Schema, and messages that say the fix.

Every format the harness reads has a JSON Schema (draft 2020-12): under ``resources/schemas/``
(fixture and bundle specs, bundle manifests, the fixture hash record, known flakes,
``build.json``, ``llama-cpp-source.json``, an older service's report state) or beside
its data (``configs/gpu/schema.json``, ``configs/gpu/kv_types.schema.json``). ``run.json``
has its own, in code, with the limits of an upload around it
(harness/results/run_schema.py).

A loader calls :func:`load_json` (YAML: parse it, then :func:`check` the data), builds
its value objects from data the schema accepted, and states what no schema can (sums
across fields, names of other files) with :func:`problem` lines passed to
:func:`fail_if_any`, so they read like the schema's own. Each line is::

    FILE: $.key.path: VALUE is not allowed: WHY; allowed: WHAT

with every problem of the file at once and the loader's fix on the last line. A schema
can say in its own words what a value must be, where its constraints say too little,
with ``"x-allowed"``; a branch of an ``if`` with a ``description`` names the rule.
"""

from harness.data_schema.messages import ALLOWED_KEYWORD, describe, join_path, problem, show
from harness.data_schema.validate import (
    SCHEMA_DIR,
    check,
    fail,
    fail_if_any,
    load_json,
    problems,
    read_json,
    schema_file,
)

__all__ = [
    "ALLOWED_KEYWORD",
    "SCHEMA_DIR",
    "check",
    "describe",
    "fail",
    "fail_if_any",
    "join_path",
    "load_json",
    "problem",
    "problems",
    "read_json",
    "schema_file",
    "show",
]
