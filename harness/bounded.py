"""Waits with an end: a file lock waited on for a bounded time, and a child process run
under a deadline and stopped together with every process it started.

A lock kept by a stuck build, or a compiler that never returns, would otherwise hold a
test until pytest-timeout ends the whole worker with no word on why. Here each wait
ends with an error that names what was waited on, the limit, the module constant that
sets it, and where to look (docs/architecture.md, "Every wait has a bound").
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import selectors
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import psutil
from filelock import FileLock, Timeout

from harness.errors import HarnessError
from harness.files import write_json_atomic
from harness.parent_death import die_with_parent_hook

#: Seconds between SIGTERM to a step's process group and SIGKILL. make and ninja delete
#: a half-written object file on SIGTERM; after SIGKILL it would look built next time.
TERM_GRACE_S = 10.0
#: Seconds to wait for a SIGKILLed process to be reaped. Longer means the kernel holds
#: it (uninterruptible sleep in a driver or on I/O), which no signal ends.
REAP_WAIT_S = 10.0
TAIL_LINES = 40
_READ_CHUNK = 65536


def holder_note(lock_path: Path) -> Path:
    """The note beside a lock saying who holds it (written by :func:`bounded_lock`)."""
    return lock_path.with_name(lock_path.name + ".holder")


@contextlib.contextmanager
def bounded_lock(lock_path: Path, *, wait_s: float, purpose: str,
                 error: type[HarnessError], setting: str) -> Iterator[None]:
    """Hold the file lock at ``lock_path`` for the ``with`` block, waiting ``wait_s`` at most.

    The holder leaves a note beside the lock (pid, host, since when, ``purpose``), so a
    waiter that gives up says who kept it waiting. ``setting`` names what sets
    ``wait_s`` (a module constant), for the message.
    """
    lock = FileLock(str(lock_path), timeout=wait_s)
    try:
        lock.acquire()
    except Timeout as exc:
        raise error(lock_wait_message(lock_path, wait_s, purpose, setting)) from exc
    try:
        write_json_atomic(holder_note(lock_path), {
            "pid": os.getpid(), "host": socket.gethostname(), "purpose": purpose,
            "since": datetime.now(UTC).isoformat(timespec="seconds")})
        yield
    finally:
        # The note goes first: the next holder's note must not be the one removed.
        holder_note(lock_path).unlink(missing_ok=True)
        lock.release()


def lock_wait_message(lock_path: Path, wait_s: float, purpose: str, setting: str) -> str:
    return (f"waited {wait_s:g} s for the lock {lock_path} ({purpose}) and gave up: "
            f"{describe_holder(lock_path)}. If that process is stuck, stop it; if no "
            f"process holds the lock, delete {lock_path}. The wait's bound is {setting}.")


def describe_holder(lock_path: Path) -> str:
    """Who holds ``lock_path``, from the note its holder left, in words."""
    try:
        note = json.loads(holder_note(lock_path).read_text(encoding="utf-8"))
        pid, host = int(note["pid"]), str(note["host"])
        since, purpose = str(note["since"]), str(note["purpose"])
    except (OSError, ValueError, KeyError, TypeError):
        return ("its holder left no note (a harness older than this one, or a process "
                "that is not the harness)")
    if host == socket.gethostname() and not process_alive(pid):
        return (f"a note says pid {pid} took it at {since} ({purpose}), but that process "
                "is gone; whoever holds it now left no note")
    return f"pid {pid} on {host} holds it since {since} ({purpose})"


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs here; a zombie (exited, not yet reaped) counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    # The state follows the command name, which is in parentheses and may hold spaces.
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")


@dataclass(frozen=True)
class StepRun:
    """How a step ended: its exit code and its last lines of output."""

    code: int
    tail: tuple[str, ...]


def run_step(argv: Sequence[str], *, step: str, limit_s: float, setting: str,
             error: type[HarnessError], log_path: Path | None = None,
             on_line: Callable[[str], object] | None = None,
             env: Mapping[str, str] | None = None) -> StepRun:
    """Run ``argv`` to its end, but never longer than ``limit_s`` seconds.

    The child leads a session of its own. At the limit, or when this wait is
    interrupted, everything it started (the compilers under ``cmake --build``,
    debootstrap's shells: :func:`stop_group`) gets SIGTERM and, ``TERM_GRACE_S`` later,
    SIGKILL, and ``error`` names ``step``, the limit, ``setting`` and ``log_path``.
    Each line of output (stdout and stderr together, without its newline) goes to
    ``on_line`` as it comes.
    """
    tail: deque[str] = deque(maxlen=TAIL_LINES)

    def line_out(line: str) -> None:
        tail.append(line)
        if on_line is not None:
            on_line(line)

    deadline = time.monotonic() + limit_s
    proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, env=env, start_new_session=True,
                            preexec_fn=die_with_parent_hook())  # noqa: PLW1509
    try:
        finished = _copy_output(proc, deadline, line_out) and _exited(proc, deadline)
        if not finished:
            stuck = None if stop_group(proc) else proc.pid
            raise error(_overrun_message(step, limit_s, setting, log_path=log_path,
                                         tail=tail, stuck_pid=stuck))
    except BaseException:
        stop_group(proc)  # interrupted (Ctrl-C, a stopping worker): nothing may outlive it
        raise
    finally:
        if proc.stdout is not None:
            proc.stdout.close()
    return StepRun(int(proc.returncode), tuple(tail))


def _copy_output(proc: subprocess.Popen[bytes], deadline: float,
                 line_out: Callable[[str], None]) -> bool:
    """Hand on ``proc``'s output line by line until it ends; False at the deadline."""
    assert proc.stdout is not None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    partial = ""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            # select, not a blocking read: a silent, hung step must not hold this loop.
            if left <= 0 or not selector.select(left):
                return False
            chunk = os.read(proc.stdout.fileno(), _READ_CHUNK)
            *lines, partial = (partial + decoder.decode(chunk, final=not chunk)).split("\n")
            for line in lines:
                line_out(line.rstrip("\r"))
            if not chunk:
                if partial:
                    line_out(partial)
                return True


def _exited(proc: subprocess.Popen[bytes], deadline: float) -> bool:
    # Output can end before the process does (it closed its stdout); the deadline holds.
    try:
        proc.wait(max(0.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        return False
    return True


def stop_group(proc: subprocess.Popen[bytes]) -> bool:
    """SIGTERM everything ``proc`` started, SIGKILL what is left after ``TERM_GRACE_S``;
    True once ``proc`` itself is reaped, False if the kernel still holds it.

    Everything: its process group, and every descendant found by walking the tree, since
    ninja starts each command in a process group of its own. The tree is read before the
    first signal, while the parents that lead to each process are still alive.
    """
    tree = _descendants(proc.pid)
    _signal_tree(proc.pid, tree, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(TERM_GRACE_S)
    # Always: the leader may have gone on SIGTERM while a child of it ignored it.
    _signal_tree(proc.pid, tree | _descendants(proc.pid), signal.SIGKILL)
    try:
        proc.wait(REAP_WAIT_S)
    except subprocess.TimeoutExpired:
        return False
    return True


def _descendants(pid: int) -> set[psutil.Process]:
    try:
        return set(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return set()


def _signal_tree(pgid: int, tree: set[psutil.Process], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for process in tree:
        # psutil checks the process is still the one it found, not a reused pid.
        with contextlib.suppress(psutil.Error):
            process.send_signal(sig)


def _overrun_message(step: str, limit_s: float, setting: str, *, log_path: Path | None,
                     tail: deque[str], stuck_pid: int | None) -> str:
    stopped = ("it was stopped with every process it started" if stuck_pid is None else
               f"it was sent SIGKILL, but pid {stuck_pid} did not exit within "
               f"{REAP_WAIT_S:g} s: the kernel holds it (uninterruptible sleep in a driver "
               "or on I/O)")
    return "\n".join([
        f"{step} did not finish within its limit of {limit_s:g} s ({setting}); {stopped}.",
        f"--- last {len(tail)} lines of its output ---", *tail,
        f"--- full log: {log_path if log_path is not None else 'none kept'} ---",
        f"hint: raise {setting} if the step is only slow here; a step that printed "
        "nothing for long is hung (a lock, the network, a full disk)",
    ])
