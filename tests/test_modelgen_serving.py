"""Fixtures that exist for a particular server behaviour show it on the real server.

Loading, drafting and the corrupt drafter are the smoke suite's job (suites/); these
are the behaviours the later suites build on: MoE tensor overrides, a drafter whose
vocab does not match, and a sliding-window KV cache.
"""

from __future__ import annotations

import re

import pytest

from harness import modelgen
from harness.client import ServerClient
from harness.planning.launch import LaunchSpec
from harness.plugin import StartServer

pytestmark = pytest.mark.server


def test_moe_experts_can_be_kept_on_the_cpu(fixture_set: modelgen.FixtureSet,
                                            start_server: StartServer) -> None:
    server = start_server(LaunchSpec(model=fixture_set.model("moe"), ctx_size=512,
                                     extra_args=("--n-cpu-moe", "1")))
    assert "tensor overrides to CPU are used with mmap enabled" in server.log_text()


def test_foreign_drafter_is_refused_but_the_server_serves(
        fixture_set: modelgen.FixtureSet, start_server: StartServer) -> None:
    server = start_server(LaunchSpec(
        model=fixture_set.model("dense"), ctx_size=512, spec_type="draft-simple",
        drafter=fixture_set.model("drafter-foreign"),
    ))
    assert "the target and draft vocabs are not compatible" in server.log_text()
    with ServerClient(server.base_url) as client:
        completion = client.completion("hello", n_predict=16, ignore_eos=True)
    assert completion.timings.predicted_n == 16
    assert completion.timings.draft_n is None


def test_swa_fixture_gets_a_windowed_kv_cache(fixture_set: modelgen.FixtureSet,
                                              start_server: StartServer) -> None:
    log = start_server(LaunchSpec(model=fixture_set.model("swa"), ctx_size=4096)).log_text()
    swa = re.search(r"creating\s+SWA KV cache, size = (\d+) cells", log)
    full = re.search(r"creating non-SWA KV cache, size = (\d+) cells", log)
    assert swa is not None, log[-3000:]
    assert full is not None, log[-3000:]
    assert int(full.group(1)) == 4096
    assert int(swa.group(1)) < 4096
