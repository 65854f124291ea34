"""The subprocess runner against the real llama-server: start, stop, crash, hang, Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from harness import modelgen
from harness.client import ServerClient
from harness.errors import ServerError, ServerExitedError, ServerNotReadyError
from harness.planning.launch import LaunchSpec
from harness.runners.subprocess_runner import SubprocessRunner

pytestmark = pytest.mark.server


@pytest.fixture
def dense(fixture_set: modelgen.FixtureSet) -> LaunchSpec:
    return LaunchSpec(model=fixture_set.model("dense"), ctx_size=256, parallel=1)


def _gone(pid: int, within_s: float = 10) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_start_serves_and_stop_ends_the_process(server_runner: SubprocessRunner,
                                                dense: LaunchSpec) -> None:
    with server_runner.start(dense) as server:
        assert server.argv[server.argv.index("--log-verbosity") + 1] == "4"
        with ServerClient(server.base_url) as client:
            assert client.health().ok
        pid = server.pid
    assert server.exit_code() is not None
    assert _gone(pid)
    # The log holds the INFO lines that -lv 4 turns on.
    assert "llama_kv_cache" in server.log_text()


def test_stop_is_idempotent(server_runner: SubprocessRunner, dense: LaunchSpec) -> None:
    server = server_runner.start(dense)
    first = server.stop()
    assert first is not None
    assert server.stop() == first


def test_a_crashed_server_reports_its_signal(server_runner: SubprocessRunner,
                                            dense: LaunchSpec) -> None:
    with server_runner.start(dense) as server:
        os.kill(server.pid, signal.SIGSEGV)
        # A dying process is a zombie for a moment before its parent can reap it.
        deadline = time.monotonic() + 10
        while server.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.exit_code() == -signal.SIGSEGV


def test_a_model_that_is_not_gguf_fails_the_start_with_the_servers_words(
        server_runner: SubprocessRunner, tmp_path: Path) -> None:
    bogus = tmp_path / "not-a-model.gguf"
    bogus.write_bytes(b"this is not a gguf file at all" * 10)
    with pytest.raises(ServerExitedError) as info:
        server_runner.start(LaunchSpec(model=bogus))
    text = str(info.value)
    assert "exited with exit code 1" in text
    assert str(bogus) in text
    assert "failed to load model" in text


def test_a_hung_load_times_out_and_the_server_is_killed(llama_server_binary: Path,
                                                        tmp_path: Path) -> None:
    # A FIFO that nobody writes: the server blocks reading the model, a real hang.
    fifo = tmp_path / "hang.gguf"
    os.mkfifo(fifo)
    runner = SubprocessRunner(llama_server_binary, tmp_path / "logs", ready_timeout_s=2)
    before = {p.pid for p in psutil.Process().children()}
    with pytest.raises(ServerNotReadyError, match=r"not ready after 2s: still waiting"):
        runner.start(LaunchSpec(model=fifo))
    spawned = {p.pid for p in psutil.Process().children()} - before
    assert all(_gone(pid) for pid in spawned)


def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"does not exist.*harness build --backend cpu"):
        SubprocessRunner(tmp_path / "llama-server", tmp_path)


_HOLDER = textwrap.dedent("""
    import signal, sys, time
    from pathlib import Path
    # Ctrl-C as a terminal delivers it: a shell that started this run in the background
    # (`cmd &`, nohup) hands its children SIGINT ignored, and Python keeps it ignored.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from harness.planning.launch import LaunchSpec
    from harness.runners.subprocess_runner import SubprocessRunner
    runner = SubprocessRunner(Path(sys.argv[1]), Path(sys.argv[3]))
    server = runner.start(LaunchSpec(model=Path(sys.argv[2]), ctx_size=256))
    print(server.pid, flush=True)
    time.sleep(120)
""")


@pytest.fixture
def holder(llama_server_binary: Path, dense: LaunchSpec,
           tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, str(llama_server_binary), str(dense.model),
         str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    pid = int(proc.stdout.readline())
    yield proc, pid
    proc.kill()
    proc.wait()


def test_ctrl_c_in_the_harness_stops_its_server(
        holder: tuple[subprocess.Popen[str], int]) -> None:
    proc, server_pid = holder
    assert psutil.pid_exists(server_pid)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=30)
    assert _gone(server_pid)


def test_a_killed_harness_takes_its_server_with_it(
        holder: tuple[subprocess.Popen[str], int]) -> None:
    proc, server_pid = holder
    proc.kill()  # no chance to clean up: the kernel's parent-death signal must do it
    proc.wait(timeout=30)
    assert _gone(server_pid)
