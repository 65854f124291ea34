"""A recorded failure from the results service (``GET /api/runs/{id}/results``)."""

from __future__ import annotations

from typing import Any

import httpx

from harness.repro.recorded_failure import RecordedFailure, recorded_failure
from harness.repro.repro_error import ReproError
from harness.repro.target import ServiceTarget

DEFAULT_TIMEOUT_S = 60.0
#: Of several results for one test (a rerun, a retried test), a failure is what to
#: reproduce; among equals the newest, as the service sorts them.
_PREFERRED = {"failed": 0, "broken": 1}


def fetch_failure(target: ServiceTarget, *,
                  timeout_s: float = DEFAULT_TIMEOUT_S) -> RecordedFailure:
    params = {"result": target.result_id} if target.result_id else {"test": target.test or ""}
    url = f"{target.service}/api/runs/{target.run_id}/results"
    try:
        with httpx.Client(timeout=timeout_s) as client:
            response = client.get(url, params=params)
    except httpx.HTTPError as exc:
        raise ReproError(f"cannot reach the results service at {target.service}: "
                         f"{exc or type(exc).__name__}; check --service and that `harness "
                         "serve` is running there") from exc
    body = _json(response)
    if response.status_code != 200:
        reason = body.get("error") if isinstance(body, dict) else response.text[:500]
        raise ReproError(f"the results service at {target.service} answered HTTP "
                         f"{response.status_code} for run {target.run_id!r}: {reason}")
    results = body.get("results") if isinstance(body, dict) else None
    if not isinstance(results, list) or not results:
        raise ReproError(f"{url} answered without results; is {target.service} the address "
                         "of `harness serve`?")
    chosen = min(results, key=lambda item: _PREFERRED.get(
        str(item.get("result", {}).get("status")), 9))
    origin = (f"run {target.run_id} on {target.service}, result "
              f"{chosen.get('result', {}).get('uuid', '?')}")
    return recorded_failure(chosen["result"], body.get("environment"),
                            chosen.get("attachments") or {}, origin, target.test)


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return None
