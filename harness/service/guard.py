"""What wraps every request of the service: a request id, the access log, the catch-all.

- Every response carries ``X-Request-Id``; the access log line and any traceback carry
  the same id, so a user's "it said 500, id 3f2a…" finds the log lines at once.
- The access log records the method, the path and the status, never the query string:
  a token pasted into ``?token=`` must not end up in a log file.
- An error no handler expected becomes a 500 whose body says only that the service
  failed and the request id: the traceback is logged, never sent (it can carry paths,
  database URLs and the data of other runs).
"""

from __future__ import annotations

import json
import logging
import time
import uuid

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from harness.service.params import shown

log = logging.getLogger(__name__)
access_log = logging.getLogger("harness.service.access")

REQUEST_ID_HEADER = "X-Request-Id"
#: Longest path an access-log line shows (the rest is cut, not the log's to keep).
_LOGGED_PATH_CHARS = 200


def new_request_id() -> str:
    return uuid.uuid4().hex[:16]


def internal_error_body(request_id: str) -> bytes:
    return json.dumps({
        "error": f"the service failed on this request (request id {request_id}); its "
                 "log holds the details under that id — report it with the id",
        "request_id": request_id,
    }).encode()


class RequestGuard:
    """ASGI middleware: request id, access log without query strings, catch-all 500."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        # Starlette's request.state reads this dict; handlers can quote the id.
        scope.setdefault("state", {})["request_id"] = request_id
        status = 0
        started = time.monotonic()

        async def send_with_id(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                headers = MutableHeaders(scope=message)
                headers.append(REQUEST_ID_HEADER, request_id)
                # Every body is what its Content-Type says: no browser guesses a JSON
                # error or a report file into HTML.
                headers.setdefault("X-Content-Type-Options", "nosniff")
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception:
            log.exception("request %s (%s %s) failed", request_id, scope["method"],
                          shown(scope["path"], _LOGGED_PATH_CHARS))
            if status == 0:
                status = 500
                await send({"type": "http.response.start", "status": 500, "headers": [
                    (b"content-type", b"application/json"),
                    (b"x-content-type-options", b"nosniff"),
                    (REQUEST_ID_HEADER.lower().encode(), request_id.encode())]})
                await send({"type": "http.response.body",
                            "body": internal_error_body(request_id)})
            # A response already under way cannot be turned into a 500; the server
            # closes the connection when the app returns without finishing it.
        finally:
            access_log.info("%s %s %s %d %.0fms", request_id, scope["method"],
                            shown(scope["path"], _LOGGED_PATH_CHARS), status,
                            (time.monotonic() - started) * 1000)
