"""The uvicorn configuration the service runs under, shared by ``harness serve`` and tests.

One place decides the HTTP protocol (uvicorn's h11 with the idle timer of
:mod:`harness.service.idle`) and that uvicorn's own access log is off: it records query
strings, and :mod:`harness.service.guard` logs every request without them.
"""

from __future__ import annotations

from typing import Any

import uvicorn
from starlette.types import ASGIApp

from harness.service.idle import idle_timeout_protocol
from harness.service.settings import DEFAULT_IDLE_TIMEOUT_S


def server_config(app: ASGIApp, **options: Any) -> uvicorn.Config:
    """uvicorn's Config for ``app`` (``options`` go to Config).

    An app made by ``create_app`` brings its settings' idle timeout; any other ASGI app
    (a test's stand-in) gets the default one.
    """
    service = getattr(getattr(app, "state", None), "service", None)
    idle_s = service.settings.idle_timeout_s if service is not None else DEFAULT_IDLE_TIMEOUT_S
    return uvicorn.Config(app, http=idle_timeout_protocol(idle_s), access_log=False,
                          **options)
