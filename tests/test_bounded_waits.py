"""Every wait ends: each one meets the real event it bounds, and the bound must hold.

The events are real: child processes that hang and ignore SIGTERM (with children of
their own), a second process holding a lock, sockets that accept a request and never
answer, answer a byte at a time or stream without end, and a process the kernel holds
past SIGKILL (a frozen cgroup). Nothing the harness calls is replaced.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import pytest
from scripted_server import ScriptedServer

from harness import bounded, modelgen
from harness.bounded import bounded_lock, process_alive, run_step
from harness.client import ServerClient
from harness.errors import (
    BuildError,
    FixtureError,
    ServerApiError,
    ServerNotReadyError,
    ServerStuckError,
)
from harness.perf import measure
from harness.perf.measure import measure_speed
from harness.runners import subprocess_runner
from harness.runners.base import RunningServer
from harness.runners.live import stop_each
from harness.runners.readiness import HealthOk, wait_until_ready
from harness.runners.subprocess_runner import SubprocessServer

#: A program that hangs, ignores SIGTERM, and has a child that does the same; it writes
#: both pids to the file named by its one argument, then says so and goes silent.
HANGS = textwrap.dedent("""\
    import os, signal, subprocess, sys, time
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; "
                              "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    with open(sys.argv[1], "w") as pids:
        pids.write(f"{os.getpid()} {child.pid}")
    print("compiling the one file that never ends", flush=True)
    time.sleep(600)
""")


@contextlib.contextmanager
def hang_program(folder: Path) -> Iterator[tuple[Path, Path]]:
    """An executable that runs ``HANGS``, and the file it writes its pids to. Whatever
    of it is still running when the block ends is killed: a failing test leaks nothing."""
    pids = folder / "pids.txt"
    program = folder / "hangs.py"
    program.write_text(f"#!{sys.executable}\n" + HANGS.replace("sys.argv[1]", repr(str(pids))))
    program.chmod(0o755)
    try:
        yield program, pids
    finally:
        for pid in ([int(p) for p in pids.read_text().split()] if pids.is_file() else []):
            with contextlib.suppress(OSError):
                if "sleep(600)" in Path(f"/proc/{pid}/cmdline").read_text() or (
                        "hangs.py" in Path(f"/proc/{pid}/cmdline").read_text()):
                    os.kill(pid, signal.SIGKILL)


def all_gone(pids_file: Path, within_s: float = 5.0) -> bool:
    """Whether every pid in ``pids_file`` is gone (a zombie counts as gone) in time."""
    pids = [int(p) for p in pids_file.read_text().split()]
    deadline = time.monotonic() + within_s
    while any(process_alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(process_alive(pid) for pid in pids)


@pytest.fixture
def short_grace(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "TERM_GRACE_S", 0.5)
    monkeypatch.setattr(bounded, "REAP_WAIT_S", 5.0)


def test_a_step_past_its_limit_is_stopped_with_every_process_it_started(
        tmp_path: Path, short_grace: None) -> None:
    with hang_program(tmp_path) as (program, pids):
        started = time.monotonic()
        with pytest.raises(BuildError) as raised:
            run_step([str(program)], step="`cmake --build ...`", limit_s=1.5,
                     setting="harness.builds.native.COMPILE_LIMIT_S", error=BuildError,
                     log_path=tmp_path / "build.log")
        took = time.monotonic() - started
        assert all_gone(pids), "a process of the step outlived it"
    text = str(raised.value)
    assert "`cmake --build ...` did not finish within its limit of 1.5 s" in text
    assert "(harness.builds.native.COMPILE_LIMIT_S)" in text
    assert "stopped with every process it started" in text
    assert "compiling the one file that never ends" in text  # its output's tail
    assert f"full log: {tmp_path / 'build.log'}" in text
    assert took < 1.5 + 0.5 + 3


def test_an_interrupted_step_leaves_no_process_behind(tmp_path: Path,
                                                      short_grace: None) -> None:
    def interrupt(line: str) -> None:
        raise KeyboardInterrupt  # Ctrl-C arriving while the step prints

    with hang_program(tmp_path) as (program, pids):
        with pytest.raises(KeyboardInterrupt):
            run_step([str(program)], step="debootstrap trixie", limit_s=60, setting="X",
                     error=BuildError, on_line=interrupt)
        assert all_gone(pids)


def test_a_step_that_ends_gives_its_code_and_its_lines_in_order() -> None:
    seen: list[str] = []
    run = run_step([sys.executable, "-c", "print('one'); print('two', flush=True); "
                    "import sys; sys.stderr.write('three'); raise SystemExit(3)"],
                   step="s", limit_s=60, setting="X", error=BuildError, on_line=seen.append)
    assert run.code == 3
    assert seen == ["one", "two", "three"]
    assert run.tail == ("one", "two", "three")


HOLDS = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from harness.bounded import bounded_lock
    from harness.errors import BuildError
    with bounded_lock(Path(sys.argv[1]), wait_s=5, purpose=sys.argv[2], error=BuildError,
                      setting="X"):
        print("held", flush=True)
        time.sleep(600)
""")


@contextlib.contextmanager
def lock_held_elsewhere(lock: Path, purpose: str) -> Iterator[subprocess.Popen[str]]:
    """Another process holding ``lock`` (taken the harness's way) until the block ends."""
    holder = subprocess.Popen([sys.executable, "-c", HOLDS, str(lock), purpose],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.kill()
        holder.wait(10)


def test_a_lock_held_past_the_wait_names_the_lock_and_its_holder(tmp_path: Path) -> None:
    lock = tmp_path / "cpu-1234.lock"
    with lock_held_elsewhere(lock, "building cpu llama-server cpu-1234") as holder:
        started = time.monotonic()
        with pytest.raises(BuildError) as raised, bounded_lock(
                lock, wait_s=0.5, purpose="building it here", error=BuildError,
                setting="harness.builds.native.BUILD_LOCK_WAIT_S"):
            pass
        took = time.monotonic() - started
    text = str(raised.value)
    assert f"waited 0.5 s for the lock {lock} (building it here)" in text
    assert f"pid {holder.pid} on {socket.gethostname()} holds it since" in text
    assert "(building cpu llama-server cpu-1234)" in text
    assert f"delete {lock}" in text
    assert "harness.builds.native.BUILD_LOCK_WAIT_S" in text
    assert took < 3
    # The holder is gone (killed): the lock is free at once, and this holder's note is
    # removed with its lock.
    with bounded_lock(lock, wait_s=5, purpose="p", error=BuildError, setting="X"):
        assert bounded.holder_note(lock).is_file()
    assert not bounded.holder_note(lock).exists()


def test_a_note_left_by_a_gone_holder_is_not_taken_for_the_holder(tmp_path: Path) -> None:
    lock = tmp_path / "source.lock"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True, timeout=60)
    bounded.holder_note(lock).write_text(
        f'{{"pid": {gone.stdout.strip()}, "host": "{socket.gethostname()}", '
        '"since": "2026-01-01T00:00:00+00:00", "purpose": "fetching"}')
    # Held now by a process that takes the lock without leaving a note.
    plain = ("import sys, time; from filelock import FileLock; lock = FileLock(sys.argv[1]); "
             "lock.acquire(); print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", plain, str(lock)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BuildError) as raised, bounded_lock(
                lock, wait_s=0.2, purpose="p", error=BuildError, setting="X"):
            pass
    finally:
        holder.kill()
        holder.wait(10)
    assert (f"a note says pid {gone.stdout.strip()} took it at 2026-01-01T00:00:00+00:00 "
            "(fetching), but that process is gone") in str(raised.value)


# --- sockets that do not answer as a server should ---------------------------------

Behaviour = Callable[[socket.socket], None]


@contextlib.contextmanager
def serving(behaviour: Behaviour) -> Iterator[str]:
    """``http://127.0.0.1:PORT`` of a real listening socket; each connection it accepts
    is handed to ``behaviour`` on a thread of its own."""
    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()
    conns: list[socket.socket] = []

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conns.append(conn)
            threading.Thread(target=_quietly, args=(behaviour, conn), daemon=True).start()

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in conns:
            conn.close()


def _quietly(behaviour: Behaviour, conn: socket.socket) -> None:
    with contextlib.suppress(OSError):  # the client hung up: that is the point
        behaviour(conn)
        conn.shutdown(socket.SHUT_RDWR)  # an answer without a length ends here


def read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
            while len(body) < length:
                body += conn.recv(65536)
    return head


def never_answers(conn: socket.socket) -> None:
    read_request(conn)
    time.sleep(60)


def answers_a_byte_at_a_time(conn: socket.socket) -> None:
    read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 1000\r\n\r\n")
    for _ in range(1000):
        conn.sendall(b" ")
        time.sleep(0.1)


def streams_without_end(conn: socket.socket) -> None:
    read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Connection: close\r\n\r\n")
    for _ in range(6000):
        conn.sendall(b'data: {"content": "a"}\n\n')
        time.sleep(0.1)


def streams_one_endless_line(conn: socket.socket) -> None:
    """A stream whose first event never ends its line: nothing is ever a whole line."""
    read_request(conn)
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                 b"Connection: close\r\n\r\ndata: {\"content\": \"")
    with contextlib.suppress(OSError):
        for _ in range(100_000):
            conn.sendall(b"a" * 65536)


def first_tokens_then_silence(conn: socket.socket) -> None:
    """First tokens at once; the timed completions after them are never answered."""
    head = read_request(conn)
    if b"Connection: close" in head:  # the streamed first-token requests say so
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Connection: close\r\n\r\ndata: {\"content\": \"a\"}\n\n")
        return
    time.sleep(60)


def test_a_call_to_a_server_that_answers_a_byte_at_a_time_ends_at_its_deadline() -> None:
    with serving(answers_a_byte_at_a_time) as url:
        started = time.monotonic()
        with ServerClient(url, timeout_s=1.0) as client, pytest.raises(
                ServerApiError, match=r"GET .*/props did not finish within 1s"):
            client.props()
        assert time.monotonic() - started < 3


def test_a_first_token_stream_without_end_ends_the_measurement() -> None:
    with serving(streams_without_end) as url:
        started = time.monotonic()
        with pytest.raises(ServerApiError, match="did not end within 1s"):
            measure_speed(url, 4, 4, 1, timeout_s=1.0)
        assert time.monotonic() - started < 3


@pytest.mark.parametrize(("cap", "timeout_s", "says"), [
    # Capped first: 2 MiB arrives long before the deadline.
    (2 << 20, 30.0, "sent a line of more than 2097152 bytes"),
    # The deadline holds within a line that never ends, too.
    (1 << 40, 1.0, "did not end within 1s"),
])
def test_a_first_token_stream_of_one_endless_line_is_cut(
        monkeypatch: pytest.MonkeyPatch, cap: int, timeout_s: float, says: str) -> None:
    monkeypatch.setattr(measure, "MAX_EVENT_BYTES", cap)
    with serving(streams_one_endless_line) as url:
        started = time.monotonic()
        with pytest.raises(ServerApiError, match=says):
            measure_speed(url, 4, 4, 1, timeout_s=timeout_s)
        assert time.monotonic() - started < 10


def test_a_measurement_ends_at_its_budget() -> None:
    with serving(first_tokens_then_silence) as url:
        started = time.monotonic()
        with pytest.raises(ServerApiError, match=r"longer than its budget of 1\.2s"):
            measure_speed(url, 4, 4, 5, timeout_s=30.0, budget_s=1.2)
        assert time.monotonic() - started < 1.2 + 2  # not the request's own 30 s


def test_a_readiness_check_begun_before_the_deadline_ends_with_it() -> None:
    with serving(never_answers) as url:
        started = time.monotonic()
        with pytest.raises(ServerNotReadyError, match="not ready after 1s"):
            wait_until_ready(ScriptedServer(url=url), [HealthOk(timeout_s=30.0)], timeout_s=1.0)
        assert time.monotonic() - started < 2.5  # not the check's own 30 s


# --- a process the kernel holds past SIGKILL ----------------------------------------

FREEZER = Path("/sys/fs/cgroup/freezer")


@pytest.fixture
def frozen_group() -> Iterator[Path]:
    """A cgroup v1 freezer group; its tasks get no signal while it is frozen, SIGKILL
    included, as a process in uninterruptible sleep gets none."""
    group = FREEZER / f"harness-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"no cgroup v1 freezer to use here ({exc}); it needs root and cgroup v1")
    try:
        yield group
    finally:
        (group / "freezer.state").write_text("THAWED")
        deadline = time.monotonic() + 10
        while (group / "tasks").read_text().strip() and time.monotonic() < deadline:
            time.sleep(0.05)
        group.rmdir()


def test_a_server_the_kernel_holds_past_sigkill_is_reported_not_waited_on(
        frozen_group: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(subprocess_runner, "KILL_WAIT_S", 1.0)
    log = tmp_path / "server.log"
    log.write_text("main: loading model\n")
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        (frozen_group / "tasks").write_text(str(process.pid))
        (frozen_group / "freezer.state").write_text("FROZEN")
        deadline = time.monotonic() + 5
        while ((frozen_group / "freezer.state").read_text().strip() != "FROZEN"
               and time.monotonic() < deadline):
            time.sleep(0.05)
        server = SubprocessServer(["llama-server"], log, process, stop_grace_s=0.5)
        started = time.monotonic()
        with pytest.raises(ServerStuckError) as raised:
            server.stop()
        took = time.monotonic() - started
    finally:
        (frozen_group / "freezer.state").write_text("THAWED")
        process.kill()
        process.wait(10)
    text = str(raised.value)
    assert f"(pid {process.pid}) did not exit within 1 s of SIGKILL" in text
    assert "main: loading model" in text  # the log's tail
    assert took < 0.5 + 1 + 2
    # It died of a signal stop() sent once the kernel let go. Which one the exit names
    # is the kernel's choice: a SIGTERM queued on a frozen task can be made the group's
    # exit before the SIGKILL behind it (seen once in CI: -15).
    assert process.returncode in (-signal.SIGTERM, -signal.SIGKILL)


def test_a_large_fixture_lock_held_too_long_names_its_holder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(modelgen, "LARGE_LOCK_WAIT_S", 0.5)
    folder = modelgen.large_fixture_folder(modelgen.LARGE_FIXTURE, tmp_path)
    folder.mkdir(parents=True)
    with lock_held_elsewhere(folder / ".lock", "writing the large fixture") as holder, \
            pytest.raises(FixtureError) as raised:
        modelgen.ensure_large_fixture(cache=tmp_path)
    text = str(raised.value)
    assert f"waited 0.5 s for the lock {folder / '.lock'}" in text
    assert f"pid {holder.pid} on" in text
    assert "harness.modelgen.LARGE_LOCK_WAIT_S" in text


@dataclass
class StuckServer(ScriptedServer):
    """A server whose stop raises as one the kernel holds does."""

    def stop(self) -> int | None:
        raise ServerStuckError("llama-server (pid 1) did not exit within 10 s of SIGKILL")


def test_one_server_that_cannot_be_stopped_does_not_keep_the_others_running(
        tmp_path: Path) -> None:
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    running = SubprocessServer(["llama-server"], tmp_path / "server.log", process,
                               stop_grace_s=5)
    try:
        with pytest.raises(ServerStuckError):
            # cast: the Protocol's __enter__ returns the class itself, and a subclass of
            # ScriptedServer inherits one that returns ScriptedServer.
            stop_each([cast(RunningServer, StuckServer()), running])
        assert process.poll() is not None  # stopped although the one before it raised
    finally:
        process.kill()
        process.wait(10)
