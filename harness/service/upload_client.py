"""Sending to the results service: a run bundle (the client half of ``harness upload``)
and a stored run's bisect (``harness bisect --attach``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.http_bounds import MIB
from harness.service.service_client import ServiceCall

UPLOAD_PATH = "/api/runs"
DEFAULT_TIMEOUT_S = 120.0
#: The answer is a run id, its URL and the report's state: a few hundred bytes.
ANSWER_MAX_BYTES = 1 * MIB


@dataclass(frozen=True)
class UploadResult:
    run_id: str
    created: bool
    run_url: str
    report: dict[str, Any]


def upload_bundle(base_url: str, bundle: Path, token: str, *,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> UploadResult:
    """POST ``bundle`` to the service at ``base_url`` within ``timeout_s`` (the send and
    the whole answer); raises ServiceError with the reason."""
    size = bundle.stat().st_size
    # Connected, then lost: the service drops the connection when a body passes its
    # upload limit before the whole bundle was sent.
    call = ServiceCall(base_url.rstrip("/"), "POST", UPLOAD_PATH, timeout_s,
                       ANSWER_MAX_BYTES, setting="--url",
                       broke_off=f"the bundle of {size} bytes may be over the service's "
                                 "upload limit (serve --max-upload-bytes), or the service "
                                 "went away")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"}
    with bundle.open("rb") as body:
        response = call.send(content=body, headers=headers, accept=range(200, 300))
    answer = call.json_object(response)
    if not isinstance(answer.get("run_id"), str):
        raise call.error(f"answered HTTP {response.status_code} without a run id; is --url "
                         "the address of `harness serve`?")
    return UploadResult(run_id=answer["run_id"], created=bool(answer.get("created")),
                        run_url=call.service + str(answer.get("url", "")),
                        report=_object(answer.get("report")))


def _object(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, dict) else {}


def bisect_path(run_id: str) -> str:
    return f"/api/runs/{quote(run_id, safe='')}/bisect"


def attach_bisect(base_url: str, run_id: str, bisect: dict[str, Any], token: str, *,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """PUT ``bisect`` as the bisect of the stored run ``run_id``; the service's answer.
    Raises ServiceError with the reason (an unknown run, a refused bisect, no service)."""
    call = ServiceCall(base_url.rstrip("/"), "PUT", bisect_path(run_id), timeout_s,
                       ANSWER_MAX_BYTES, setting="--service")
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    response = call.send(content=json.dumps(bisect).encode(), headers=headers)
    return call.json_object(response)
