"""A recorded test result, as ``harness repro`` needs it: test, outcome, build, servers.

``recorded_failure`` is pure: it reads an Allure result (the JSON allure-pytest wrote),
the run's ``environment.properties`` text and the text attachments. ``load_result_file``
gathers those from an ``allure-results`` folder on disk; ``harness.repro.fetch`` gets
them from the results service.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.repro.properties import parse_properties
from harness.repro.repro_error import ReproError
from harness.results.test_ids import current_test_id

ENVIRONMENT_FILE = "environment.properties"
_SERVER_ARGV = re.compile(r"server (\d+) argv")
#: The label the recording plugin puts the pytest node id in.
NODEID_LABEL = "nodeid"


@dataclass(frozen=True)
class RecordedFailure:
    nodeid: str
    uuid: str
    #: Allure's status: failed, broken, passed, skipped.
    status: str
    message: str
    properties: dict[str, str]
    #: Each server's argv as the test started it, in start order.
    server_argvs: tuple[tuple[str, ...], ...]
    fixtures: tuple[str, ...]
    #: Where it was read from, for messages.
    origin: str

    @property
    def headline(self) -> str:
        """The message's first line: what a rerun's failure is compared by."""
        return first_line(self.message)


def first_line(message: str) -> str:
    return next((line.strip() for line in message.splitlines() if line.strip()), "")


def labels(result: Mapping[str, Any], name: str) -> list[str]:
    return [str(label.get("value", "")) for label in result.get("labels") or ()
            if isinstance(label, dict) and label.get("name") == name]


def argv_attachments(result: Mapping[str, Any]) -> list[tuple[int, str]]:
    """(server number, attachment file) of every ``server N argv`` attachment."""
    found = []
    for attachment in result.get("attachments") or ():
        if not isinstance(attachment, dict):
            continue
        match = _SERVER_ARGV.fullmatch(str(attachment.get("name", "")))
        if match and isinstance(attachment.get("source"), str):
            found.append((int(match.group(1)), attachment["source"]))
    return sorted(found)


def recorded_failure(result: Mapping[str, Any], environment: str | None,
                     attachments: Mapping[str, str], origin: str,
                     nodeid: str | None = None) -> RecordedFailure:
    """The failure in ``result``; ``attachments`` maps attachment file names to text."""
    if environment is None:
        raise ReproError(
            f"{origin}: no {ENVIRONMENT_FILE} beside the result; the pytest session that "
            "wrote it ended before its last step (it is written at session end). Repro needs "
            "the build it names: run the test again with --alluredir and let it finish")
    nodeids = labels(result, NODEID_LABEL)
    chosen = nodeid or (nodeids[0] if nodeids else None)
    if not chosen:
        raise ReproError(
            f"{origin}: the result has no {NODEID_LABEL!r} label (it was written by a harness "
            "older than harness repro); name the test with --test NODEID")
    details = result.get("statusDetails") or {}
    argvs = []
    for number, source in argv_attachments(result):
        text = attachments.get(source)
        if text is None:
            raise ReproError(f"{origin}: attachment 'server {number} argv' ({source}) is "
                             "missing; copy the whole allure-results folder, not one file")
        argvs.append(tuple(text.split()))
    return RecordedFailure(
        nodeid=current_test_id(chosen), uuid=str(result.get("uuid", "")),
        status=str(result.get("status", "")),
        message=str(details.get("message") or "") if isinstance(details, dict) else "",
        properties=parse_properties(environment), server_argvs=tuple(argvs),
        fixtures=tuple(labels(result, "fixture")), origin=origin)


def load_result_file(path: Path, nodeid: str | None = None) -> RecordedFailure:
    """An Allure ``*-result.json`` and what lies beside it in its folder."""
    try:
        result = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ReproError(f"cannot read the Allure result {path}: {exc.strerror or exc}; pass "
                         "a *-result.json file from an allure-results folder") from exc
    except ValueError as exc:
        raise ReproError(f"{path} is not JSON ({exc}); pass a *-result.json file that "
                         "allure-pytest wrote") from exc
    if not isinstance(result, dict) or "uuid" not in result:
        raise ReproError(f"{path} is not an Allure test result (no uuid); pass a "
                         "*-result.json file, not a container or attachment")
    folder = path.parent
    env_file = folder / ENVIRONMENT_FILE
    environment = env_file.read_text(encoding="utf-8") if env_file.is_file() else None
    attachments = {}
    for _, source in argv_attachments(result):
        file = folder / Path(source).name
        if file.is_file():
            attachments[source] = file.read_text(encoding="utf-8", errors="replace")
    return recorded_failure(result, environment, attachments, str(path), nodeid)
