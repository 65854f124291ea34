"""A Docker engine on a real socket that fails the way a stuck engine does.

It speaks the few API calls the harness makes (version, images, build, containers:
create, inspect, start, logs, wait, stop, remove) with minimal valid answers, except the
calls a test names: those are either never answered (``hang``: the socket stays open
and silent, as an engine blocked on a lock or a dead disk leaves it) or answered with a
stream that never ends (``endless``: a build that keeps printing, a log stream the
engine never closes). The harness's docker client talks to it over TCP exactly as to a
real engine; nothing of the client is replaced.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

CONTAINER_ID = "f" * 64
IMAGE_ID = "sha256:" + "a" * 64
API_VERSION = "1.41"
#: How often an endless stream sends something.
_TICK_S = 0.1


class FakeEngine:
    """The engine; ``seen`` lists every request as ``METHOD /path`` (version prefix cut)."""

    def __init__(self, *, hang: frozenset[str] = frozenset(),
                 endless: frozenset[str] = frozenset()) -> None:
        #: Calls never answered, and calls answered with a stream that never ends, by
        #: name: ``build``, ``wait``, ``logs``.
        self.hang = hang
        self.endless = endless
        self.seen: list[str] = []
        #: Set when the client closed an endless stream under the engine.
        self.client_left = threading.Event()
        self._closing = threading.Event()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.engine = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"tcp://127.0.0.1:{self._server.server_address[1]}"

    def start(self) -> FakeEngine:
        self._thread.start()
        return self

    def close(self) -> None:
        self._closing.set()
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = urlsplit(handler.path).path
        if path.startswith(f"/v{API_VERSION}/"):
            path = path[len(f"/v{API_VERSION}"):]
        self.seen.append(f"{handler.command} {path}")
        _read_body(handler)
        name = _call_name(handler.command, path)
        if name in self.hang:
            self._closing.wait()  # never answers; the socket stays open and silent
            handler.close_connection = True
            return
        if name in self.endless:
            self._stream_forever(handler, name)
            return
        status, body = _plain_answer(handler.command, path)
        _send(handler, status, body)

    def _stream_forever(self, handler: BaseHTTPRequestHandler, name: str) -> None:
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json" if name == "build"
                            else "application/vnd.docker.raw-stream")
        handler.send_header("Transfer-Encoding", "chunked")
        handler.end_headers()
        handler.close_connection = True
        sent = 0
        try:
            while not self._closing.is_set():
                # A build prints on; a log stream says one line and then nothing more.
                if name == "build" or sent == 0:
                    _write_chunk(handler, _stream_piece(name))
                    sent += 1
                time.sleep(_TICK_S)
        except OSError:
            self.client_left.set()


@contextmanager
def fake_engine(*, hang: frozenset[str] = frozenset(),
                endless: frozenset[str] = frozenset()) -> Iterator[FakeEngine]:
    engine = FakeEngine(hang=hang, endless=endless).start()
    try:
        yield engine
    finally:
        engine.close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the test's output is not the place for an access log

    def do_GET(self) -> None:
        self.server.engine.answer(self)  # type: ignore[attr-defined]

    do_POST = do_GET
    do_DELETE = do_GET
    do_HEAD = do_GET


def _call_name(method: str, path: str) -> str:
    if method == "POST" and path == "/build":
        return "build"
    for name in ("wait", "logs"):
        if path.startswith("/containers/") and path.endswith(f"/{name}"):
            return name
    return f"{method} {path}"


def _plain_answer(method: str, path: str) -> tuple[int, Any]:
    """What a healthy engine answers, in the fewest fields the client reads."""
    if path == "/version":
        return 200, {"ApiVersion": API_VERSION, "Version": "fake", "MinAPIVersion": "1.12"}
    if path == "/_ping":
        return 200, "OK"
    if path == "/images/json":
        return 200, []
    if path.startswith("/images/") and path.endswith("/json"):
        return 200, {"Id": IMAGE_ID, "RepoTags": [path[len("/images/"):-len("/json")]]}
    if path == "/build":
        return 200, {"stream": "Successfully built\n"}
    if path == "/containers/create":
        return 201, {"Id": CONTAINER_ID, "Warnings": []}
    if path.startswith("/containers/"):
        return _container_answer(method, path)
    return 404, {"message": f"{method} {path} is not faked"}


def _container_answer(method: str, path: str) -> tuple[int, Any]:
    if method == "DELETE" or path.endswith(("/start", "/stop", "/kill")):
        return 204, None
    if path.endswith("/wait"):
        return 200, {"StatusCode": 0}
    if path.endswith("/logs"):
        return 200, b""
    return 200, {"Id": CONTAINER_ID, "Name": "/fake", "Config": {"Tty": False},
                 "State": {"Running": True, "Pid": 0}, "HostConfig": {}}


def _send(handler: BaseHTTPRequestHandler, status: int, body: Any) -> None:
    data = b"" if body is None else body if isinstance(body, bytes) else (
        json.dumps(body).encode())
    handler.send_response(status)
    if body is not None:
        handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _read_body(handler: BaseHTTPRequestHandler) -> None:
    if handler.headers.get("Transfer-Encoding", "").lower() == "chunked":
        while size := int(handler.rfile.readline().strip() or b"0", 16):
            handler.rfile.read(size + 2)
        handler.rfile.readline()
        return
    handler.rfile.read(int(handler.headers.get("Content-Length") or 0))


def _stream_piece(name: str) -> bytes:
    if name == "build":
        return json.dumps({"stream": "[ 42%] Building CXX object still-going.o\n"}).encode()
    line = b"main: loading model\n"
    return struct.pack(">BxxxL", 1, len(line)) + line  # stdout frame, multiplexed


def _write_chunk(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    handler.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
    handler.wfile.flush()
