"""A recorded failure from the results service (``GET /api/runs/{id}/results``)."""

from __future__ import annotations

from urllib.parse import quote

from harness.http_bounds import MIB
from harness.repro.recorded_failure import RecordedFailure, recorded_failure
from harness.repro.repro_error import ReproError
from harness.repro.target import ServiceTarget
from harness.service.service_client import ServiceCall

DEFAULT_TIMEOUT_S = 60.0
#: One test's results with their text attachments, each cut at 1 MiB by the service
#: (service/results.py): a rerun test with many logs stays well under this.
MAX_ANSWER_BYTES = 64 * MIB
#: Of several results for one test (a rerun, a retried test), a failure is what to
#: reproduce; among equals the newest, as the service sorts them.
_PREFERRED = {"failed": 0, "broken": 1}


def fetch_failure(target: ServiceTarget, *,
                  timeout_s: float | None = None) -> RecordedFailure:
    """The recorded failure ``target`` names, read within ``timeout_s`` (default
    :data:`DEFAULT_TIMEOUT_S`); a call the service does not answer as it should is a
    ServiceError."""
    params = {"result": target.result_id} if target.result_id else {"test": target.test or ""}
    path = f"/api/runs/{quote(target.run_id, safe='')}/results"
    call = ServiceCall(target.service.rstrip("/"), "GET", path,
                       DEFAULT_TIMEOUT_S if timeout_s is None else timeout_s, MAX_ANSWER_BYTES)
    body = call.json_object(call.send(params=params))
    results = body.get("results")
    if isinstance(results, list):
        results = [item for item in results
                   if isinstance(item, dict) and isinstance(item.get("result"), dict)]
    if not isinstance(results, list) or not results:
        raise ReproError(f"{call.service}{call.path} answered without results; is "
                         f"{target.service} the address of `harness serve`?")
    chosen = min(results, key=lambda item: _PREFERRED.get(str(item["result"].get("status")), 9))
    origin = (f"run {target.run_id} on {target.service}, result "
              f"{chosen['result'].get('uuid', '?')}")
    environment = body.get("environment")
    attachments = chosen.get("attachments")
    return recorded_failure(chosen["result"],
                            environment if isinstance(environment, str) else None,
                            attachments if isinstance(attachments, dict) else {}, origin,
                            target.test)
