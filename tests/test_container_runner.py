"""The container runner against the real llama-server image: serve, fail, hang, stop, sweep.

The image is the plugin's ``container_image``: ``--harness-image``, the build under
test's image, or the CPU image of the pinned source (``harness build --container``,
built when missing — never skipped).
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness import modelgen
from harness.client import ServerClient
from harness.errors import ConfigError, ServerExitedError, ServerNotReadyError
from harness.planning.launch import LaunchSpec
from harness.probes.docker_engine import docker_engine
from harness.runners.container_labels import MANAGED_LABEL, SESSION_ID, SESSION_LABEL
from harness.runners.container_runner import ContainerRunner, ContainerServer
from harness.runners.container_sweep import sweep_containers
from harness.runners.driver_cache import DRIVER_CACHE_ENV, MOUNT_POINT, driver_cache_dir

pytestmark = [pytest.mark.docker, pytest.mark.server]

@pytest.fixture(scope="module")
def engine() -> Iterator[Any]:
    client = docker_engine()
    yield client
    client.close()


@pytest.fixture(scope="module")
def image(container_image: str) -> str:
    """The plugin's image: --harness-image, the build under test's, or the CPU image."""
    return container_image


def _ours(engine: Any) -> list[str]:
    """Ids of this process's harness containers, running or not."""
    return [c["Id"] for c in engine.api.containers(
        all=True, filters={"label": [f"{MANAGED_LABEL}=1", f"{SESSION_LABEL}={SESSION_ID}"]})]


@pytest.fixture(autouse=True)
def no_leftovers(engine: Any) -> Iterator[None]:
    """Each test must leave no container behind; a failed one is cleaned up anyway."""
    yield
    left = _ours(engine)
    sweep_containers(engine, session=SESSION_ID)
    assert not left, f"containers left behind: {left}"


@pytest.fixture
def runner(image: str, tmp_path: Path) -> ContainerRunner:
    # Two threads per server: xdist workers share the cores.
    return ContainerRunner(image, tmp_path / "logs", ready_timeout_s=60, stop_grace_s=5,
                           default_threads=2)


@pytest.fixture
def dense(fixture_set: modelgen.FixtureSet) -> LaunchSpec:
    return LaunchSpec(model=fixture_set.model("dense"), ctx_size=256, parallel=1)


def _until_exited(server: ContainerServer, within_s: float = 10) -> int | None:
    deadline = time.monotonic() + within_s
    while server.exit_code() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return server.exit_code()


def test_a_container_serves_the_dense_fixture(runner: ContainerRunner, dense: LaunchSpec,
                                              engine: Any) -> None:
    with runner.start(dense) as server:
        # The subprocess runner's argv, bar the binary: the files are at their host paths.
        expected = dataclasses.replace(dense, threads=2).to_argv("x", "127.0.0.1", 0)
        assert server.argv == ["/app/llama-server", *expected[1:]]
        with ServerClient(server.base_url) as client:
            assert client.props().model_path == str(dense.model)
            assert client.completion("Hello", n_predict=4).tokens_predicted >= 1
        attrs = engine.containers.get(server.container_id).attrs
        assert attrs["HostConfig"]["NetworkMode"] == "host"
        assert attrs["Config"]["Labels"][SESSION_LABEL] == SESSION_ID
        # The drivers' caches are one kept host folder, writable, named in the environment.
        assert f"{driver_cache_dir()}:{MOUNT_POINT}:rw" in attrs["HostConfig"]["Binds"]
        assert f"MESA_SHADER_CACHE_DIR={MOUNT_POINT}/mesa" in attrs["Config"]["Env"]
        assert server.exit_code() is None
    assert server.exit_code() == 0  # SIGTERM: the server shuts down cleanly
    # -lv 4: the INFO lines the verdicts read are in the followed log.
    assert "llama_kv_cache" in server.log_text()
    assert server.container_id not in _ours(engine)


def test_driver_cache_off_mounts_no_cache(image: str, dense: LaunchSpec, tmp_path: Path,
                                          engine: Any,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(DRIVER_CACHE_ENV, "off")
    runner = ContainerRunner(image, tmp_path / "logs", ready_timeout_s=60, stop_grace_s=5,
                             default_threads=2)
    server = runner.launch(dense)
    try:
        attrs = engine.containers.get(server.container_id).attrs
        assert not any(MOUNT_POINT in bind for bind in attrs["HostConfig"]["Binds"])
        assert not any(var.startswith("MESA_SHADER_CACHE_DIR=")
                       for var in attrs["Config"]["Env"])
    finally:
        server.stop()


def test_stop_removes_the_container_and_is_idempotent(runner: ContainerRunner,
                                                      dense: LaunchSpec, engine: Any) -> None:
    server = runner.start(dense)
    assert _ours(engine) == [server.container_id]
    first = server.stop()
    assert first is not None
    assert server.stop() == first
    assert _ours(engine) == []


def test_a_corrupt_drafter_fails_the_start_in_the_servers_words(
        runner: ContainerRunner, dense: LaunchSpec, fixture_set: modelgen.FixtureSet,
        engine: Any) -> None:
    spec = LaunchSpec(model=dense.model, ctx_size=256, spec_type="draft-simple",
                      drafter=fixture_set.model("drafter-corrupt"))
    with pytest.raises(ServerExitedError) as failure:
        runner.start(spec)
    message = str(failure.value)
    assert "failed to load draft model" in message
    assert "exited with exit code 1" in message
    assert _ours(engine) == []


def test_a_crashed_server_reports_its_signal(runner: ContainerRunner, dense: LaunchSpec,
                                            engine: Any) -> None:
    with runner.start(dense) as server:
        # The server is the child of the container's init (docker-init); signal it from
        # the host, as the subprocess test does. (`docker kill` signals the init, which
        # does not pass on a synchronous signal such as SIGSEGV.)
        init_pid = engine.containers.get(server.container_id).attrs["State"]["Pid"]
        (llama_server,) = psutil.Process(init_pid).children()
        assert llama_server.name() == "llama-server"
        llama_server.send_signal(signal.SIGSEGV)
        # Docker says 139 (128 + 11); the runner says -11, like a child process.
        assert _until_exited(server) == -signal.SIGSEGV


def test_a_hung_load_times_out_with_the_log_tail(image: str, tmp_path: Path,
                                                 engine: Any) -> None:
    # A FIFO that nobody writes, mounted as the model: the server blocks reading it.
    fifo = tmp_path / "hang.gguf"
    os.mkfifo(fifo)
    runner = ContainerRunner(image, tmp_path / "logs", ready_timeout_s=2, stop_grace_s=1)
    with pytest.raises(ServerNotReadyError) as failure:
        runner.start(LaunchSpec(model=fifo))
    message = str(failure.value)
    assert "not ready after 2s: still waiting for the server to announce its port" in message
    assert f"--model {fifo}" in message
    assert "exit code: still running" in message
    tail = message.split("log lines ---", 1)[1]
    assert str(fifo) in tail  # the server's own "loading model" line
    assert _ours(engine) == []


def test_sweep_removes_a_left_over_container(runner: ContainerRunner, dense: LaunchSpec,
                                             engine: Any) -> None:
    server = runner.launch(dense)  # never stopped: as if the harness had been killed
    assert _ours(engine) == [server.container_id]
    # A sweep at session start spares what is younger than its threshold.
    assert sweep_containers(engine, older_than_s=3600, session=SESSION_ID) == 0
    assert sweep_containers(engine, session=SESSION_ID) == 1
    assert _ours(engine) == []
    assert _until_exited(server) == -signal.SIGKILL
    server.stop()  # the owner's own stop finds nothing left to do


def test_a_missing_image_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not in the local Docker engine.*ci/docker"):
        ContainerRunner("harness-probe/no-such-image:never", tmp_path)
