"""Sending a run bundle to the results service (the client half of ``harness upload``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from harness.errors import HarnessError

UPLOAD_PATH = "/api/runs"


class UploadError(HarnessError):
    """The service refused the upload, or could not be reached."""


@dataclass(frozen=True)
class UploadResult:
    run_id: str
    created: bool
    run_url: str
    report: dict[str, Any]


def upload_bundle(base_url: str, bundle: Path, token: str, *,
                  timeout_s: float = 120.0) -> UploadResult:
    """POST ``bundle`` to the service at ``base_url``; raises UploadError with the reason."""
    url = base_url.rstrip("/") + UPLOAD_PATH
    headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/gzip"}
    try:
        with bundle.open("rb") as body, httpx.Client(timeout=timeout_s) as client:
            response = client.post(url, content=body, headers=headers)
    except (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol) as exc:
        raise UploadError(
            f"cannot reach the results service at {base_url}: {exc or type(exc).__name__}; "
            "check the --url and that `harness serve` is running there") from exc
    except httpx.HTTPError as exc:
        # Connected, then lost: the service drops the connection when a body passes its
        # upload limit before the whole bundle was sent.
        raise UploadError(
            f"the upload of {bundle.stat().st_size} bytes to the results service at "
            f"{base_url} broke off: {exc or type(exc).__name__}; the bundle may be over the "
            "service's upload limit (serve --max-upload-bytes), or the service went "
            "away") from exc
    return _result(base_url, response)


def _result(base_url: str, response: httpx.Response) -> UploadResult:
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        reason = body.get("error") if isinstance(body, dict) else None
        raise UploadError(
            f"the results service at {base_url} refused the upload "
            f"(HTTP {response.status_code}): {reason or response.text.strip()[:500]}")
    if not isinstance(body, dict) or not isinstance(body.get("run_id"), str):
        raise UploadError(
            f"{base_url} answered HTTP {response.status_code} without a run id; is --url "
            "the address of `harness serve`?")
    return UploadResult(run_id=body["run_id"], created=bool(body.get("created")),
                        run_url=base_url.rstrip("/") + str(body.get("url", "")),
                        report=dict(body.get("report") or {}))
