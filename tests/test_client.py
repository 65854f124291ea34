"""The typed API client against a real llama-server."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness import modelgen
from harness.client import ServerClient
from harness.errors import ServerApiError
from harness.planning.launch import LaunchSpec
from harness.runners.subprocess_runner import SubprocessRunner, SubprocessServer

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def server(server_runner: SubprocessRunner,
           fixture_set: modelgen.FixtureSet) -> Iterator[SubprocessServer]:
    spec = LaunchSpec(model=fixture_set.model("dense"), ctx_size=512, parallel=2, metrics=True)
    with server_runner.start(spec) as running:
        yield running


@pytest.fixture
def client(server: SubprocessServer) -> Iterator[ServerClient]:
    with ServerClient(server.base_url, timeout_s=10) as api:
        yield api


def test_health(client: ServerClient) -> None:
    health = client.health()
    assert health.ok
    assert health.status == "ok"


def test_props_reports_the_launch(client: ServerClient, server: SubprocessServer) -> None:
    props = client.props()
    assert props.model_path == server.argv[server.argv.index("--model") + 1]
    assert props.total_slots == 2
    assert props.n_ctx == 256  # 512 cells shared by 2 slots


def test_slots_lists_each_slot(client: ServerClient) -> None:
    assert len(client.slots()) == 2


def test_completion_is_typed_and_deterministic_at_temperature_zero(client: ServerClient) -> None:
    first = client.completion("The quick brown fox", n_predict=8)
    second = client.completion("The quick brown fox", n_predict=8)
    assert first.tokens_predicted == 8
    assert first.timings.predicted_n == 8
    assert first.timings.prompt_n > 0
    assert first.timings.draft_n is None  # no drafter, no draft statistics
    assert first.content == second.content


def test_metrics_when_enabled(client: ServerClient) -> None:
    assert "llamacpp:" in client.metrics()


def test_a_dead_address_is_a_clear_error() -> None:
    with ServerClient("http://127.0.0.1:9", timeout_s=2) as dead, \
            pytest.raises(ServerApiError, match=r"GET http://127.0.0.1:9/health failed.*still"):
        dead.health()
