"""RPC servers (``ggml-rpc-server``) started, capped, killed and stopped for real, with a
real llama-server of the same RPC build pointed at them.

The build is the pinned source with the RPC backend (``harness build --rpc``), built on
first use and cached. Each test starts its own servers, on ports of their own.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness import modelgen
from harness.bounded import process_alive
from harness.builds.native import BuildResult
from harness.builds.resolve import ensure_build
from harness.errors import ServerError
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners import rpc_devices
from harness.runners.rpc_devices import (
    CAP_MARGIN_BYTES,
    RpcServer,
    RpcServerError,
    idle_vm_bytes,
    rpc_argument,
    rpc_servers,
    start_rpc_server,
)
from harness.runners.subprocess_runner import SubprocessRunner

pytestmark = pytest.mark.server

MIB = 1024 * 1024
#: What llama-server says when the RPC device refuses the model's buffer.
SERVER_ALLOC_FAILED = "error loading model: unable to allocate RPC0[{endpoint}] buffer"
#: What the RPC server's CPU device says when RLIMIT_AS refuses it.
RPC_ALLOC_FAILED = "ggml_backend_cpu_buffer_type_alloc_buffer: failed to allocate buffer"


@pytest.fixture(scope="module")
def rpc_build(harness_cache: Path) -> BuildResult:
    build = ensure_build(harness_cache, BuildRequest(rpc=True))
    assert build.info.rpc_server is not None, f"{build.directory} has no RPC server"
    return build


@pytest.fixture(scope="module")
def rpc_binary(rpc_build: BuildResult) -> Path:
    assert rpc_build.info.rpc_server is not None
    return Path(rpc_build.info.rpc_server)


@pytest.fixture
def held_port() -> Iterator[int]:
    """A loopback port this test listens on, so no RPC server can bind it."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def _serve(rpc_build: BuildResult, model: Path, rpc: str, log_dir: Path) -> None:
    """Start llama-server on ``model``, every layer on the ``--rpc`` devices, until it
    answers a completion (the runner's readiness); stopped at once."""
    runner = SubprocessRunner(rpc_build.binary, log_dir, ready_timeout_s=60.0,
                              default_threads=1)
    spec = LaunchSpec(model=model, n_gpu_layers=99, ctx_size=256, parallel=1,
                      extra_args=("--rpc", rpc))
    runner.start(spec).stop()


def _log_once_it_shows(server: RpcServer, text: str) -> str:
    deadline = time.monotonic() + 5
    while text not in (log := server.log_text()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return log


def _rpc_children() -> list[int]:
    """This process's running RPC servers (pids)."""
    running = []
    for child in psutil.Process().children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):  # gone meanwhile: not running
            if child.name() == "ggml-rpc-server" and child.status() != psutil.STATUS_ZOMBIE:
                running.append(child.pid)
    return running


def test_a_started_server_accepts_at_its_endpoint_and_stop_leaves_no_process(
        rpc_binary: Path, tmp_path: Path) -> None:
    server = start_rpc_server(rpc_binary, tmp_path)
    try:
        assert server.endpoint == f"127.0.0.1:{server.port}"
        assert server.alive()
        assert server.exit_code() is None
        assert server.memory_cap_bytes is None
        assert server.address_space_bytes is None
        # The readiness probe flushes the banner and closes its connection (the server
        # sees both a moment after the probe returns).
        log = _log_once_it_shows(server, "Client connection closed")
        assert f"endpoint       : {server.endpoint}" in log
        socket.create_connection(("127.0.0.1", server.port), timeout=5).close()
    finally:
        code = server.stop()
    assert code == -15
    assert not server.alive()
    assert not process_alive(server.pid)
    assert server.stop() == -15  # a second stop changes nothing


def test_kill_ends_the_server_at_once(rpc_binary: Path, tmp_path: Path) -> None:
    with start_rpc_server(rpc_binary, tmp_path) as server:
        server.kill()
        assert not server.alive()
        assert server.exit_code() == -9
        assert not process_alive(server.pid)


def test_a_port_taken_by_another_listener_is_a_clear_error(
        rpc_binary: Path, tmp_path: Path, held_port: int) -> None:
    # The held socket accepts connects: only the server's own listener counts as ready.
    with pytest.raises(RpcServerError) as caught:
        start_rpc_server(rpc_binary, tmp_path, _port=held_port)
    message = str(caught.value)
    assert str(rpc_binary) in message
    assert f"127.0.0.1:{held_port}" in message
    assert rpc_devices.BIND_FAILED in message
    assert not _rpc_children()


def test_a_port_taken_before_the_server_binds_it_is_retried_on_another(
        rpc_binary: Path, tmp_path: Path, held_port: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([held_port])
    real_pick = rpc_devices._free_port
    monkeypatch.setattr(rpc_devices, "_free_port", lambda host: next(picks, None)
                        or real_pick(host))
    with start_rpc_server(rpc_binary, tmp_path) as server:
        assert server.port != held_port
        assert server.alive()
    logs = [path.read_text() for path in tmp_path.glob("ggml-rpc-server-*.log")]
    assert sum(rpc_devices.BIND_FAILED in log for log in logs) == 1


def test_a_binary_that_cannot_run_is_a_clear_error(tmp_path: Path) -> None:
    binary = tmp_path / "ggml-rpc-server"
    binary.write_text("not a program")
    with pytest.raises(RpcServerError, match="not executable"):
        start_rpc_server(binary, tmp_path)


def test_a_failing_later_start_stops_the_servers_already_started(
        rpc_binary: Path, tmp_path: Path, held_port: int,
        monkeypatch: pytest.MonkeyPatch) -> None:
    real_pick = rpc_devices._free_port
    picks = iter([real_pick("127.0.0.1")])
    # The first server gets a free port, every try of the second the held one.
    monkeypatch.setattr(rpc_devices, "_free_port", lambda host: next(picks, held_port))
    with pytest.raises(RpcServerError, match="could not bind"), \
            rpc_servers(rpc_binary, (None, None), tmp_path):
        pytest.fail("the second server cannot have started")
    assert len(list(tmp_path.glob("ggml-rpc-server-*.log"))) == 1 + rpc_devices.BIND_ATTEMPTS
    assert not _rpc_children()


def test_two_devices_serve_one_model(rpc_build: BuildResult, rpc_binary: Path,
                                     fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    with rpc_servers(rpc_binary, (None, None), tmp_path / "rpc") as servers:
        assert rpc_argument(servers) == f"{servers[0].endpoint},{servers[1].endpoint}"
        _serve(rpc_build, fixture_set.model("dense"), rpc_argument(servers), tmp_path)
        for server in servers:
            # After the readiness probe's connection, llama-server's own.
            assert server.log_text().count("Accepted client connection") >= 2
    assert not any(process_alive(server.pid) for server in servers)


def test_a_memory_cap_below_the_model_fails_its_load_and_one_above_serves(
        rpc_build: BuildResult, rpc_binary: Path, fixture_set: modelgen.FixtureSet,
        tmp_path: Path) -> None:
    model = fixture_set.model("bench")  # 36.4 MiB of weights on the device
    with rpc_servers(rpc_binary, (4 * MIB, 64 * MIB), tmp_path / "rpc") as (small, large):
        idle = idle_vm_bytes(rpc_binary, tmp_path)
        assert small.address_space_bytes == idle + 4 * MIB + CAP_MARGIN_BYTES
        limits = Path(f"/proc/{small.pid}/limits").read_text()
        assert f"Max address space         {small.address_space_bytes}" in limits

        with pytest.raises(ServerError) as caught:
            _serve(rpc_build, model, small.endpoint, tmp_path / "small")
        assert SERVER_ALLOC_FAILED.format(endpoint=small.endpoint) in str(caught.value)
        assert RPC_ALLOC_FAILED in small.log_text()
        assert small.alive()  # the refusal is an answer, not a crash

        _serve(rpc_build, model, large.endpoint, tmp_path / "large")
        assert RPC_ALLOC_FAILED not in large.log_text()


def test_a_server_dies_with_the_harness_process(rpc_binary: Path, tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from harness.runners.rpc_devices import start_rpc_server
        server = start_rpc_server(Path({str(rpc_binary)!r}), Path({str(tmp_path)!r}))
        print(server.pid, flush=True)
        time.sleep(60)
    """)
    harness = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                               text=True)
    try:
        assert harness.stdout is not None
        pid = int(harness.stdout.readline())
        assert process_alive(pid)
    finally:
        harness.kill()  # no finally of its runs: only the parent-death signal is left
        harness.wait(10)
    deadline = time.monotonic() + 10
    while process_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(pid)
