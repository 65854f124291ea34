"""Performance: the bench fixture serves with figures a baseline gate can judge.

The tiny fixtures decode thousands of tokens a second, so their speed mostly measures
HTTP and scheduling. ``bench`` (6 layers, 384 wide, about 40 MiB) makes each token cost
real matrix work. Like every server, this one is measured before it stops when the run
keeps a record (``harness run``); here the test checks the measurement itself works on
this build, so a broken figure fails a test instead of quietly leaving a gap.
"""

from __future__ import annotations

import pytest

from harness import modelgen
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS
from harness.perf.measure import measure_speed, peak_host_mib
from harness.planning.launch import LaunchSpec
from harness.plugin import StartServer
from harness.runners.subprocess_runner import SubprocessServer

pytestmark = pytest.mark.server


def test_bench_model_serves_with_measurable_speed(fixture_set: modelgen.FixtureSet,
                                                  start_server: StartServer) -> None:
    server = start_server(LaunchSpec(model=fixture_set.model("bench"), ctx_size=512))
    speed = measure_speed(server.base_url, DEFAULT_PROMPT_TOKENS, DEFAULT_GEN_TOKENS,
                          repetitions=3)
    assert speed.decode_tps is not None, speed
    assert speed.prompt_tps is not None, speed
    assert speed.ttft_ms is not None, speed
    assert min(speed.decode_tps, speed.prompt_tps, speed.ttft_ms) > 0, speed
    # Decoding is slower than reading the prompt in one batch on any backend.
    assert speed.prompt_tps > speed.decode_tps, speed
    if isinstance(server, SubprocessServer):
        peak = peak_host_mib(server.pid)
        # The weights alone are ~37 MiB and mmapped pages count once touched.
        assert peak is not None, "VmHWM unreadable for a live server"
        assert peak > 30, peak
