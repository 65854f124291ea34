"""Run an ASGI app under a real uvicorn server in a thread (tests, local tools).

The socket is bound before the server starts, on port 0 by default, so the caller
knows the address without racing anything else for a free port.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn
from starlette.types import ASGIApp

from harness.errors import HarnessError
from harness.service.server import server_config

STARTUP_TIMEOUT_S = 30.0


@contextmanager
def serve_in_thread(app: ASGIApp, *, host: str = "127.0.0.1", port: int = 0,
                    timeout_s: float = STARTUP_TIMEOUT_S) -> Iterator[str]:
    """Serve ``app``; yields its base URL (``http://host:port``) once it is started."""
    # IPPROTO_TCP named, not left 0: asyncio sets TCP_NODELAY only on sockets whose proto
    # says TCP, and without it every answer on a kept-alive connection waited ~40 ms for
    # the client's delayed ACK (uvicorn's own bind, as in `harness serve`, names it).
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound_port = sock.getsockname()[1]
    # lifespan "on": a failing startup (the store, the report worker) is an error here.
    server = uvicorn.Server(server_config(app, lifespan="on", log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]},
                              name=f"uvicorn-{bound_port}", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise HarnessError(f"the service on {host}:{bound_port} did not start within "
                                   f"{timeout_s:.0f}s; its log above says why")
            time.sleep(0.02)
        yield f"http://{host}:{bound_port}"
    finally:
        server.should_exit = True
        thread.join(timeout_s)
        sock.close()
