"""The readiness wait's control flow, with a scripted stand-in for a server process.

The real server is exercised in test_runner.py; here a fake only drives the
harness's own loop (order of conditions, crash detection, the timeout message).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from scripted_server import ScriptedServer

from harness.errors import ServerApiError, ServerExitedError, ServerNotReadyError
from harness.runners.base import RunningServer
from harness.runners.readiness import ProcessAlive, default_conditions, wait_until_ready


@dataclass
class CountingCondition:
    ready_after: int
    calls: int = 0

    def pending(self, server: RunningServer) -> str | None:
        self.calls += 1
        return None if self.calls > self.ready_after else "the thing"


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_conditions_are_met_in_order() -> None:
    first, second = CountingCondition(ready_after=2), CountingCondition(ready_after=1)
    clock = FakeClock()
    wait_until_ready(ScriptedServer(), [first, second], timeout_s=10, clock=clock,
                     sleep=clock.sleep)
    assert first.calls == 3  # not asked again once met
    assert second.calls == 2


def test_a_crash_is_reported_at_once_with_argv_and_log_tail() -> None:
    clock = FakeClock()
    with pytest.raises(ServerExitedError) as info:
        wait_until_ready(ScriptedServer(exit_after_polls=3), [CountingCondition(10**6)],
                         timeout_s=1000, clock=clock, sleep=clock.sleep)
    text = str(info.value)
    assert "exited with exit code 1 before it was ready" in text
    assert "argv: llama-server -m model.gguf" in text
    assert "line 99" in text
    assert "line 60" in text
    assert "line 59" not in text
    assert clock.now < 1  # long before the deadline


def test_timeout_says_what_was_awaited() -> None:
    clock = FakeClock()
    with pytest.raises(ServerNotReadyError) as info:
        wait_until_ready(ScriptedServer(), [CountingCondition(10**6)], timeout_s=5,
                         clock=clock, sleep=clock.sleep)
    text = str(info.value)
    assert "not ready after 5s: still waiting for the thing" in text
    assert "exit code: still running" in text
    assert "HARNESS_READY_TIMEOUT" in text


def test_process_alive_passes_for_a_live_process() -> None:
    assert ProcessAlive().pending(ScriptedServer()) is None


class _FailingCompletions(BaseHTTPRequestHandler):
    """Answers as b10502 did on a byte-vocabulary fixture: healthy, but every completion
    fails inside the server (HTTP 500 with llama-server's error body)."""

    def do_GET(self) -> None:
        self._answer(200, {"status": "ok"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self._answer(500, {"error": {"code": 500, "type": "server_error", "message": (
            "The model produced output that does not match the expected Content-only "
            "format")}})

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


def test_a_server_whose_completions_fail_inside_it_is_reported_at_once() -> None:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _FailingCompletions)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        server = ScriptedServer(url=f"http://127.0.0.1:{httpd.server_port}")
        started = time.monotonic()
        with pytest.raises(ServerApiError) as raised:
            wait_until_ready(server, default_conditions(), timeout_s=60)
        # Not the 60 s of asking again: the first 500 ends the wait.
        assert time.monotonic() - started < 10
        assert raised.value.status_code == 500
        message = str(raised.value)
        assert "llama-server is up but its first completion failed" in message
        assert "Content-only format" in message
        assert "line 99" in message  # the log tail
    finally:
        httpd.shutdown()
        httpd.server_close()
