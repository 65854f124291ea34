"""What ``harness repro`` was pointed at: a result file, or a run on the results service (pure).

A report URL of the service (``http://host:port/runs/<run_id>/report/...``) names the
service and the run; a test result's page in it carries the result's id in the
fragment — allure-pytest's uuid, or Allure 3's id for it (the md5 of that uuid).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

from harness.repro.repro_error import ReproError

_REPORT_PATH = re.compile(r"/runs/(?P<run>[^/]+)/report(?:/.*)?")
#: A uuid with dashes, or 32 hex digits (a dashless uuid or Allure 3's md5 id).
_RESULT_ID = re.compile(r"[0-9a-fA-F]{8}-(?:[0-9a-fA-F]{4}-){3}[0-9a-fA-F]{12}|[0-9a-fA-F]{32}")


@dataclass(frozen=True)
class ServiceTarget:
    service: str
    run_id: str
    test: str | None = None
    result_id: str | None = None


@dataclass(frozen=True)
class FileTarget:
    path: Path


Target = ServiceTarget | FileTarget


def is_url(text: str) -> bool:
    return text.startswith(("http://", "https://"))


def parse_report_url(url: str, test: str | None = None) -> ServiceTarget:
    """The service, run and result a report URL names; ``test`` fills in a missing result."""
    parts = urlsplit(url)
    match = _REPORT_PATH.fullmatch(parts.path)
    if not parts.netloc or match is None:
        raise ReproError(
            f"{url} is not a report URL of the results service; expected "
            "http://HOST:PORT/runs/RUN_ID/report/... (or pass --run RUN_ID --test NODEID "
            "--service URL)")
    ids = _RESULT_ID.findall(unquote(parts.fragment))
    if not ids and test is None:
        raise ReproError(
            f"{url} names run {unquote(match['run'])!r} but no test result: open the failed "
            "test in the report and copy that address (its #fragment holds the result's id), "
            "or add --test NODEID")
    return ServiceTarget(service=f"{parts.scheme}://{parts.netloc}",
                         run_id=unquote(match["run"]), test=test,
                         result_id=ids[-1].lower() if ids else None)


def parse_target(failure: str | None, *, run_id: str | None, test: str | None,
                 service: str | None) -> Target:
    """One of: a result file, a report URL, or ``--run`` + ``--test`` + ``--service``."""
    if failure is not None and run_id is not None:
        raise ReproError("give either a FAILURE (a result file or a report URL) or --run, "
                         "not both")
    if failure is not None:
        if is_url(failure):
            return parse_report_url(failure, test)
        return FileTarget(Path(failure))
    if run_id is None:
        raise ReproError("nothing to reproduce: pass an Allure *-result.json, a report URL "
                         "of the results service, or --run RUN_ID --test NODEID --service URL")
    if test is None:
        raise ReproError(f"--run {run_id} needs --test NODEID (the pytest node id of the "
                         "failed test, as the report's nodeid label shows it)")
    if not service:
        raise ReproError(f"--run {run_id} needs --service URL (the results service, e.g. "
                         "http://127.0.0.1:8080) or HARNESS_SERVICE_URL")
    return ServiceTarget(service=service.rstrip("/"), run_id=run_id, test=test)
