"""The first-token prompt ``harness ab`` sizes from its probe start (pure), and the
requests that send it (a recording stand-in for the server drives measure_speed)."""

from __future__ import annotations

import json
import math
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from harness.ab.first_token import LONGEST_PROMPT, first_token_prompt, wanted_first_token_ms
from harness.perf.measure import measure_speed

FLOOR_MS = 5.0
THRESHOLD = 0.03


def _sized(ttft_ms: float | None, prompt_tps: float | None, n_prompt: int = 32) -> int:
    return first_token_prompt(n_prompt, ttft_ms, prompt_tps, floor_ms=FLOOR_MS,
                              threshold=THRESHOLD)


def test_a_fast_first_token_gets_a_prompt_long_enough_for_the_floor() -> None:
    # The bench fixture here: 16 ms at 32 tokens, about 3,200 prompt tokens a second.
    length = _sized(16.0, 3200.0)
    predicted_ms = 16.0 + (length - 32) / 3200.0 * 1000.0
    assert predicted_ms >= wanted_first_token_ms(FLOOR_MS, THRESHOLD)
    assert FLOOR_MS / predicted_ms < THRESHOLD
    # The shortest doubling that does it: half of it would not.
    assert 16.0 + (length // 2 - 32) / 3200.0 * 1000.0 < wanted_first_token_ms(
        FLOOR_MS, THRESHOLD)
    assert length == 1024


def test_a_slow_first_token_keeps_the_timed_prompt() -> None:
    # A large model on a CPU: 32 tokens already take most of a second.
    assert _sized(800.0, 40.0) == 32
    assert _sized(800.0, 40.0, n_prompt=512) == 512


def test_a_probe_without_figures_keeps_the_timed_prompt() -> None:
    assert _sized(None, 3200.0) == 32
    assert _sized(16.0, None) == 32
    assert _sized(16.0, 0.0) == 32
    assert _sized(math.nan, 3200.0) == 32
    assert _sized(16.0, math.inf) == 32


def test_the_prompt_never_passes_the_longest() -> None:
    # A very fast prompt (a small model on a large GPU) would want more than allowed.
    assert _sized(2.0, 500_000.0) == LONGEST_PROMPT
    assert _sized(2.0, 500_000.0, n_prompt=LONGEST_PROMPT) == LONGEST_PROMPT


def test_nonsense_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="must be above 0"):
        first_token_prompt(0, 16.0, 3200.0, floor_ms=FLOOR_MS, threshold=THRESHOLD)
    with pytest.raises(ValueError, match="must be above 0"):
        first_token_prompt(32, 16.0, 3200.0, floor_ms=FLOOR_MS, threshold=0.0)


class _RecordingServer(BaseHTTPRequestHandler):
    """Answers /completion as llama-server does, in outline, and records each request's
    kind (streamed first-token or timed) and prompt length, in order."""

    seen: ClassVar[list[tuple[str, int]]] = []

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        streamed = bool(body.get("stream"))
        self.seen.append(("first" if streamed else "timed", len(body["prompt"])))
        if streamed:
            payload = b'data: {"content": "a"}\n\n'
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
        else:
            payload = json.dumps({"content": "abcd", "tokens_predicted": 4, "timings": {
                "prompt_per_second": 100.0, "predicted_per_second": 50.0}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize(("first_token_prompt", "expected"), [
    (None, [("first", 32)] * 3 + [("timed", 32)] * 2),
    # Shorter than the timed prompt: sent as asked, first.
    (16, [("first", 16)] * 3 + [("timed", 32)] * 2),
    # Longer: sent as asked, after the timed completions.
    (1024, [("timed", 32)] * 2 + [("first", 1024)] * 3),
])
def test_the_first_token_requests_send_the_prompt_asked_for(
        first_token_prompt: int | None, expected: list[tuple[str, int]]) -> None:
    _RecordingServer.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _RecordingServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        sample = measure_speed(f"http://127.0.0.1:{server.server_port}", 32, 4, 2,
                               first_token_prompt=first_token_prompt)
    finally:
        server.shutdown()
        server.server_close()
    assert _RecordingServer.seen == expected
    assert sample.ttft_ms is not None
    assert (sample.prompt_tps, sample.decode_tps) == (100.0, 50.0)
