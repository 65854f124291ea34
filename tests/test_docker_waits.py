"""Every wait on the Docker engine ends, against an engine that stops answering.

The engine is :mod:`fake_docker`: a real socket that speaks the engine's API and leaves
the calls a test names unanswered, or streaming without end. The harness's own docker
client talks to it as to a real engine, so what is tested is the harness's bound, not a
stand-in's. No real engine is needed.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from fake_docker import API_VERSION, CONTAINER_ID, FakeEngine, fake_engine

from harness.builds import container_build
from harness.builds.container_build import build_image
from harness.builds.source import local_source
from harness.errors import BuildError
from harness.planning.build_plan import BuildRequest
from harness.probes import devices
from harness.probes.devices import list_devices_in_image
from harness.runners import llama_server_container
from harness.runners.llama_server_container import LlamaServerContainer

FAKE_TREE = Path(__file__).parent / "data" / "fake-llama"
BASES = {"BUILD_BASE": "fake/build:1", "RUNTIME_BASE": "fake/runtime:1"}


def _client(engine: FakeEngine) -> Any:
    return docker.DockerClient(base_url=engine.url, version=API_VERSION, timeout=10)


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "llama.cpp"
    shutil.copytree(FAKE_TREE, tree)
    return tree


@pytest.fixture
def short_image_build(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(container_build, "IMAGE_BUILD_LIMIT_S", 1.0)
    return 1.0


def test_an_image_build_that_prints_forever_is_cut_at_its_limit(
        tmp_path: Path, fake_tree: Path, short_image_build: float) -> None:
    with fake_engine(endless=frozenset({"build"})) as engine:
        client = _client(engine)
        started = time.monotonic()
        with pytest.raises(BuildError) as raised:
            build_image(client, tmp_path / "cache", local_source(fake_tree), BuildRequest(),
                        bases=BASES)
        took = time.monotonic() - started
        client.close()
        # Cutting the connection is what makes the engine cancel the build.
        assert engine.client_left.wait(5), "the build's connection was left open"
    text = str(raised.value)
    assert "image build did not finish within its limit of 1 s" in text
    assert "harness.builds.container_build.IMAGE_BUILD_LIMIT_S" in text
    assert "Building CXX object still-going.o" in text  # the log's tail
    assert "build.log" in text
    assert took < short_image_build + 5


def test_an_image_build_the_engine_never_answers_ends_at_its_limit(
        tmp_path: Path, fake_tree: Path, short_image_build: float) -> None:
    with fake_engine(hang=frozenset({"build"})) as engine:
        client = _client(engine)
        started = time.monotonic()
        with pytest.raises(BuildError, match="did not finish within its limit of 1 s"):
            build_image(client, tmp_path / "cache", local_source(fake_tree), BuildRequest(),
                        bases=BASES)
        took = time.monotonic() - started
        client.close()
    assert took < short_image_build + 5


def test_a_device_listing_that_never_ends_is_bounded_and_removed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "LIST_DEVICES_LIMIT_S", 1.0)
    with fake_engine(hang=frozenset({"wait"})) as engine:
        client = _client(engine)
        started = time.monotonic()
        with pytest.raises(BuildError) as raised:
            list_devices_in_image(client, "harness/llama-server:fake", None)
        took = time.monotonic() - started
        client.close()
        seen = list(engine.seen)
    assert "did not finish in a container within 1 s" in str(raised.value)
    assert "harness.probes.devices.LIST_DEVICES_LIMIT_S" in str(raised.value)
    assert f"DELETE /containers/{CONTAINER_ID}" in seen  # the listing is not left running
    assert took < 6


@pytest.fixture
def engine_that_never_lets_go(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeEngine]:
    """An engine whose log stream never ends and which never reports an exit status."""
    monkeypatch.setattr(llama_server_container, "FOLLOWER_JOIN_S", 0.5)
    monkeypatch.setattr(llama_server_container, "STATUS_WAIT_S", 0.5)
    with fake_engine(hang=frozenset({"wait"}), endless=frozenset({"logs"})) as engine:
        monkeypatch.setenv("DOCKER_HOST", engine.url)
        yield engine


def test_a_container_whose_engine_never_lets_go_is_stopped_in_bounded_time(
        engine_that_never_lets_go: FakeEngine, tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    server = LlamaServerContainer("harness/llama-server:fake", ["--port", "0"], log,
                                  stop_grace_s=1).start()
    deadline = time.monotonic() + 5
    while b"loading model" not in log.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert b"loading model" in log.read_bytes()  # the follower runs
    assert server.exit_status() is None
    started = time.monotonic()
    server.stop()
    took = time.monotonic() - started
    # No status from the engine: removed by force, which kills.
    assert server.exit_status() == -signal.SIGKILL
    assert f"DELETE /containers/{CONTAINER_ID}" in engine_that_never_lets_go.seen
    assert took < 5
