"""The harness's calls to the results service, each held to a deadline and a size cap.

Every call has a deadline for the whole of it (connect, send, the whole answer) and a
cap on its answer (``harness/http_bounds.py``, the exact deadline), and every way it can
fail is one :class:`~harness.errors.ServiceError` naming the service, the call and what
happened: no answer, none in time, too long an answer, an error status with the start
of the service's reason, a body that is not JSON, a number that is not finite. A service
that stalls, streams without end or sends ``NaN`` is an error line, never a hang, a
traceback or a process that fills memory. Each caller keeps its bounds as module
constants beside the call (docs/service.md, "Client bounds", lists them).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import httpx

from harness.errors import ServiceError
from harness.http_bounds import BoundExceeded, bounded_call_in_time
from harness.service.finite_json import NotFiniteError, loads_finite

#: How much of an error answer a message quotes.
REASON_CHARS = 300


@dataclass(frozen=True)
class ServiceCall:
    """One call: the service's base URL, method and path, and the call's bounds."""

    service: str
    method: str
    path: str
    timeout_s: float
    max_bytes: int
    #: Where the user gave the service's address, named when it cannot be reached.
    setting: str = "--service"
    #: What a connection that broke off after it was made may mean, for this call.
    broke_off: str = "the service closed the connection or went away"

    def error(self, what: str, status_code: int | None = None) -> ServiceError:
        return ServiceError(f"the results service at {self.service}: {self.method} "
                            f"{self.path} {what}", what, status_code)

    def send(self, http: httpx.Client | None = None, *,
             accept: Collection[int] | None = (200,), **kwargs: Any) -> httpx.Response:
        """The whole answer, whose status is in ``accept`` (None: any status).

        ``http``: a client to reuse across calls (kept open); default: one for this
        call. ``kwargs`` go to httpx (``params``, ``content``, ``headers``).
        """
        try:
            if http is not None:
                response = self._bounded(http, kwargs)
            else:
                with httpx.Client() as own:
                    response = self._bounded(own, kwargs)
        except BoundExceeded as exc:
            raise self.error(exc.what) from exc
        except httpx.TimeoutException as exc:
            raise self.error(f"did not finish within {self.timeout_s:g}s "
                             f"({type(exc).__name__})") from exc
        except (httpx.ConnectError, httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
            raise ServiceError(
                f"cannot reach the results service at {self.service} ({self.method} "
                f"{self.path}): {exc or type(exc).__name__}; check {self.setting} and that "
                "`harness serve` is running there",
                f"no answer ({type(exc).__name__}: {exc})") from exc
        except httpx.HTTPError as exc:
            raise self.error(f"broke off ({type(exc).__name__}: {exc}); "
                             f"{self.broke_off}") from exc
        if accept is not None and response.status_code not in accept:
            raise self.error(f"answered HTTP {response.status_code}: {reason(response)}",
                             response.status_code)
        return response

    def _bounded(self, http: httpx.Client, kwargs: dict[str, Any]) -> httpx.Response:
        return bounded_call_in_time(http, self.method, self.service + self.path,
                                    timeout_s=self.timeout_s, max_bytes=self.max_bytes,
                                    **kwargs)

    def json(self, response: httpx.Response) -> Any:
        """The answer's JSON; refused (a ServiceError) when it is not JSON or holds a
        number that is not finite."""
        try:
            return loads_finite(response.content)
        except NotFiniteError as exc:
            raise self.error(f"sent {exc}") from exc
        except ValueError as exc:
            raise self.error(f"sent a body that is not JSON ({exc}): "
                             f"{_printable(response.text[:REASON_CHARS])!r}; is "
                             f"{self.setting} the address of `harness serve`?") from exc

    def json_object(self, response: httpx.Response) -> dict[str, Any]:
        """:meth:`json`, which must be an object."""
        body = self.json(response)
        if not isinstance(body, dict):
            raise self.error(f"sent {type(body).__name__} where an object was expected; is "
                             f"{self.setting} the address of `harness serve`?")
        return body


def reason(response: httpx.Response) -> str:
    """Why the service refused: its JSON ``error``, else the start of the body."""
    try:
        body = loads_finite(response.content)
    except ValueError:
        body = None
    said = body.get("error") if isinstance(body, dict) else None
    text = said if isinstance(said, str) else response.text.strip()
    return _printable(text[:REASON_CHARS]) or "no reason given"


def _printable(text: str) -> str:
    # A hostile answer must not move the cursor or recolour the terminal it is shown on.
    return "".join(c if c.isprintable() else " " for c in text)
