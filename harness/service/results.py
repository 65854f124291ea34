"""A stored run's Allure results for one test, with their text attachments (the read side).

``harness repro`` fetches a failure from the service through this: the results of a
test (by the ``nodeid`` label the harness's plugin writes) or of one result id — the
``uuid`` allure-pytest gave it, or the id Allure 3's report shows for it (the md5 of
that uuid) — newest first, plus the run's ``environment.properties``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

ENVIRONMENT_FILE = "environment.properties"
#: Text attachments are returned up to this size each (a failed test's whole startup
#: log is kept, and a response must stay bounded); longer ones are cut and listed.
MAX_ATTACHMENT_BYTES = 1 << 20
_TEXT_TYPES = ("text/", "application/json")


def _matches(result: dict[str, Any], test: str | None, result_id: str | None) -> bool:
    if result_id is not None:
        uuid = str(result.get("uuid", "")).lower()
        wanted = result_id.lower()
        return wanted in (uuid, uuid.replace("-", ""),
                          hashlib.md5(str(result.get("uuid", "")).encode()).hexdigest())
    return any(isinstance(label, dict) and label.get("name") == "nodeid"
               and label.get("value") == test for label in result.get("labels") or ())


def find_results(results_dir: Path, *, test: str | None,
                 result_id: str | None) -> list[dict[str, Any]]:
    """Each matching result with its text attachments, newest (by ``stop``) first."""
    found: list[dict[str, Any]] = []
    for path in sorted(results_dir.glob("*-result.json")):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue  # an unreadable result is the report's warning, not this reader's
        if isinstance(result, dict) and _matches(result, test, result_id):
            attachments, truncated = _attachments(results_dir, result)
            found.append({"file": path.name, "result": result, "attachments": attachments,
                          "truncated": truncated})
    found.sort(key=lambda item: item["result"].get("stop") or 0, reverse=True)
    return found


def _attachments(results_dir: Path, result: dict[str, Any]) -> tuple[dict[str, str], list[str]]:
    texts: dict[str, str] = {}
    truncated: list[str] = []
    for attachment in result.get("attachments") or ():
        if not isinstance(attachment, dict):
            continue
        source, kind = attachment.get("source"), str(attachment.get("type", ""))
        # Sources are bare file names beside the result; anything else is not served.
        if (not isinstance(source, str) or Path(source).name != source
                or not kind.startswith(_TEXT_TYPES)):
            continue
        file = results_dir / source
        if not file.is_file() or file.is_symlink():
            continue
        with file.open("rb") as handle:
            data = handle.read(MAX_ATTACHMENT_BYTES + 1)
        if len(data) > MAX_ATTACHMENT_BYTES:
            truncated.append(source)
            data = data[:MAX_ATTACHMENT_BYTES]
        texts[source] = data.decode("utf-8", errors="replace")
    return texts, truncated


def read_environment(results_dir: Path) -> str | None:
    path = results_dir / ENVIRONMENT_FILE
    return path.read_text(encoding="utf-8", errors="replace") if path.is_file() else None
