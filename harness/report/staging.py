"""Copy the readable part of an allure-results folder aside, and say what was left out.

One truncated ``*-result.json`` (a worker killed mid-write), a file that is not a JSON
object, or a dangling link must not cost the whole report: every result and container
file is read and checked here first, the good ones (and every attachment and run-level
file) go to a staging folder that Allure then reads, and each bad one becomes a
``"<path>: <why>"`` problem for the user. A result whose attachment is missing is kept;
the report shows the attachment as missing, and the problem names it.

The history file Allure appends to is checked the same way: a line that is not a JSON
object (a run killed mid-append) would stop Allure, so such lines are dropped and named.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.files import atomic_write_bytes
from harness.report.allure_meta import CATEGORIES_FILE
from harness.report.history_ids import migrate_history_point

RESULT_SUFFIX = "-result.json"
CONTAINER_SUFFIX = "-container.json"


@dataclass(frozen=True)
class StagedResults:
    """What went into the staging folder."""

    directory: Path
    #: Result files staged (one per test run, retries included).
    results: int
    #: The run's own ``categories.json`` rules, when it has readable ones.
    categories: list[dict[str, Any]] | None
    problems: tuple[str, ...]


class _Bad(Exception):
    """A file that cannot go into the report; the message says why."""


def stage_results(results_dir: Path, staging_dir: Path) -> StagedResults:
    """Copy the readable files of ``results_dir`` (top level only) into ``staging_dir``."""
    staging_dir.mkdir(parents=True, exist_ok=True)
    problems: list[str] = []
    results = 0
    categories: list[dict[str, Any]] | None = None
    names = {p.name for p in _entries(results_dir)}
    for path in _entries(results_dir):
        try:
            if path.name.endswith((RESULT_SUFFIX, CONTAINER_SUFFIX)):
                data, document = _json_object(path)
                problems += [f"{path}: {m}" for m in missing_attachments(document, names)]
                atomic_write_bytes(staging_dir / path.name, data)
                results += path.name.endswith(RESULT_SUFFIX)
            elif path.name == CATEGORIES_FILE:
                data = _read(path)
                categories = parse_categories(data)
                atomic_write_bytes(staging_dir / path.name, data)
            else:
                _link_or_copy(path, staging_dir / path.name)
        except _Bad as why:
            problems.append(f"{path}: {why}")
    return StagedResults(staging_dir, results, categories, tuple(problems))


def _entries(results_dir: Path) -> Iterator[Path]:
    # Dot-files are the atomic writers' temporaries; sub-folders are not Allure's layout.
    for path in sorted(results_dir.iterdir()):
        if not path.name.startswith(".") and not path.is_dir():
            yield path


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise _Bad(f"unreadable ({exc.strerror or exc})") from exc


def _json_object(path: Path) -> tuple[bytes, dict[str, Any]]:
    data = _read(path)
    return data, parse_json_object(data)


def parse_json_object(data: bytes) -> dict[str, Any]:
    """``data`` as a JSON object, or ``_Bad`` saying what is wrong with it."""
    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise _Bad(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from exc
    except json.JSONDecodeError as exc:
        # A file cut short mid-write does not end where a JSON document can.
        hint = "" if exc.doc.rstrip().endswith(("}", "]")) else " (truncated?)"
        raise _Bad(f"not valid JSON{hint}: {exc.msg} at line {exc.lineno} column "
                   f"{exc.colno}") from exc
    if not isinstance(document, dict):
        raise _Bad(f"a JSON {type(document).__name__}, not an object")
    return document


def parse_categories(data: bytes) -> list[dict[str, Any]]:
    """A ``categories.json``'s rules; ``_Bad`` unless it is a list of named objects."""
    try:
        rules = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _Bad(f"not valid JSON ({exc}); the harness's own categories are used") from exc
    if not isinstance(rules, list) or not all(
            isinstance(r, dict) and isinstance(r.get("name"), str) and r["name"].strip()
            for r in rules):
        raise _Bad("not a list of categories with names; the harness's own categories are "
                   "used")
    return rules


def missing_attachments(document: dict[str, Any], present: set[str]) -> list[str]:
    """Attachments (of the result, its steps, a container's fixtures) whose file is absent."""
    missing = []
    for attachment in _attachments(document):
        source = attachment.get("source")
        if not isinstance(source, str) or source not in present:
            name = attachment.get("name")
            label = f" ({name!r})" if isinstance(name, str) else ""
            missing.append(f"attachment {source!r}{label} is missing")
    return missing


def _attachments(node: object) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "attachments" and isinstance(value, list):
                yield from (a for a in value if isinstance(a, dict))
            else:
                yield from _attachments(value)
    elif isinstance(node, list):
        for item in node:
            yield from _attachments(item)


def _link_or_copy(source: Path, target: Path) -> None:
    # Attachments can be large server logs; a hard link costs nothing where it works.
    try:
        os.link(source, target)
    except OSError:
        try:
            shutil.copyfile(source, target)
        except OSError as exc:
            raise _Bad(f"unreadable ({exc.strerror or exc})") from exc


def repair_history(path: Path) -> tuple[str, ...]:
    """Drop the lines of the history file that are not JSON objects; name each one. A
    point written before the suites moved gets the keys its tests have now (history_ids).

    A missing file is a first run. An unreadable one is left alone and reported; the
    caller then renders without history rather than let Allure fail on it.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ()
    except OSError as exc:
        raise HistoryUnreadableError(f"{path}: unreadable ({exc.strerror or exc})") from exc
    kept: list[bytes] = []
    problems: list[str] = []
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            point = parse_json_object(line)
        except _Bad as why:
            problems.append(f"{path} line {number}: {why}; the line was dropped")
            continue
        migrated = migrate_history_point(point)
        kept.append(line if migrated is point else
                    json.dumps(migrated, ensure_ascii=False).encode("utf-8"))
    text = b"".join(line + b"\n" for line in kept)
    if text != data:
        # Rewritten also when only the final newline was missing: Allure appends the
        # next run right after the last byte.
        atomic_write_bytes(path, text)
    return tuple(problems)


class HistoryUnreadableError(Exception):
    """The history file exists but cannot be read."""
