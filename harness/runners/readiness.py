"""Readiness as a composable wait: each condition is tried in order until all hold.

A condition (:class:`~harness.runners.base.WaitCondition`) returns ``None`` when it is
satisfied or a short text saying what it still waits for. When the deadline passes, the
error carries that text, the argv, the exit code and the last log lines, plus a hint, so
a CI log alone explains the failure. It sits beside the runners because every runner's
``start`` waits with it; the supervisor above them waits with it too.

The deadline is kept to the check: a check that calls the server
(:class:`~harness.runners.base.TimedCondition`) waits at most the time left, and none
starts once the deadline has passed, so a wait ends within its timeout plus one poll.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from harness.client import ServerClient, shared_pool
from harness.errors import ServerApiError, ServerError, ServerExitedError, ServerNotReadyError
from harness.runners.base import RunningServer, TimedCondition, WaitCondition
from harness.runners.observe import notify_ready

LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class ProcessAlive:
    """Fails at once, not at the deadline, when the process has exited."""

    def pending(self, server: RunningServer) -> str | None:
        code = server.exit_code()
        if code is not None:
            raise ServerExitedError(describe_failure(
                server, f"llama-server exited with {_exit_text(code)} before it was ready",
                hint="the server's own error is in the log lines above",
            ))
        return None


@dataclass(frozen=True)
class AddressKnown:
    """The server has bound its port (with ``--port 0`` it says which in its log)."""

    def pending(self, server: RunningServer) -> str | None:
        try:
            _ = server.base_url
        except ServerError:
            return "the server to announce its port ('listening on http://…' in its log)"
        return None


@dataclass(frozen=True)
class HealthOk:
    """``GET /health`` answers 200 (503 means the model is still loading)."""

    timeout_s: float = 2.0

    def pending(self, server: RunningServer) -> str | None:
        return self.pending_within(server, self.timeout_s)

    def pending_within(self, server: RunningServer, timeout_s: float) -> str | None:
        try:
            with ServerClient(server.base_url, min(self.timeout_s, timeout_s),
                              shared_pool()) as client:
                health = client.health()
        except ServerApiError as exc:
            return f"/health unreachable: {exc}"
        return None if health.ok else f"/health answered {health.status_code} {health.status}"


#: The status llama-server answers a request that failed inside it (503 means loading).
INTERNAL_ERROR = 500


@dataclass(frozen=True)
class CompletionReturnsTokens:
    """A short ``/completion`` yields at least one token: the model really runs."""

    n_predict: int = 1
    timeout_s: float = 30.0

    def pending(self, server: RunningServer) -> str | None:
        return self.pending_within(server, self.timeout_s)

    def pending_within(self, server: RunningServer, timeout_s: float) -> str | None:
        try:
            with ServerClient(server.base_url, min(self.timeout_s, timeout_s),
                              shared_pool()) as client:
                completion = client.completion("Hello", n_predict=self.n_predict)
        except ServerApiError as exc:
            if exc.status_code == INTERNAL_ERROR:
                # Past /health the model is loaded: a 500 is the server failing the
                # request (b10502's chat parser on text that is not valid UTF-8), and
                # asking again until the deadline would only hide it for two minutes.
                raise ServerApiError(describe_failure(
                    server, f"llama-server is up but its first completion failed: {exc}",
                    hint="the server's own error; its log tail is above"),
                    exc.status_code) from exc
            return f"/completion failed: {exc}"
        if completion.tokens_predicted < 1:
            return "/completion returned no tokens"
        return None


def default_conditions() -> tuple[WaitCondition, ...]:
    return (ProcessAlive(), AddressKnown(), HealthOk(), CompletionReturnsTokens())


def wait_until_ready(
    server: RunningServer,
    conditions: Sequence[WaitCondition],
    timeout_s: float,
    *,
    poll_interval_s: float = 0.02,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """Block until every condition holds, in order, or raise with the full story."""
    deadline = clock() + timeout_s
    remaining = list(conditions)
    last_pending = "nothing checked yet"
    while True:
        while remaining:
            # Liveness is re-checked on every round, so a crash mid-wait is seen at once.
            ProcessAlive().pending(server)
            left = deadline - clock()
            if left <= 0:
                break
            pending = _pending_within(remaining[0], server, left)
            if pending is not None:
                last_pending = pending
                break
            remaining.pop(0)
        if not remaining:
            notify_ready(server)
            return
        if clock() >= deadline:
            raise ServerNotReadyError(describe_failure(
                server, f"llama-server was not ready after {timeout_s:g}s: still waiting "
                f"for {last_pending}",
                hint="a hung load or a model too large for this machine; raise the timeout "
                "with HARNESS_READY_TIMEOUT if the model is simply slow to load",
            ))
        sleep(min(poll_interval_s, max(0.0, deadline - clock())))


def _pending_within(condition: WaitCondition, server: RunningServer, left_s: float) -> str | None:
    if isinstance(condition, TimedCondition):
        return condition.pending_within(server, left_s)
    return condition.pending(server)


ServerT = TypeVar("ServerT", bound=RunningServer)


def ready_or_stopped(server: ServerT, conditions: Sequence[WaitCondition],
                     timeout_s: float) -> ServerT:
    """Wait until ``server`` is ready; one that is not is stopped before the error goes on."""
    try:
        wait_until_ready(server, conditions, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def describe_failure(server: RunningServer, headline: str, hint: str) -> str:
    code = server.exit_code()
    tail = server.log_tail(LOG_TAIL_LINES)
    return "\n".join([
        headline,
        f"  argv: {' '.join(server.argv)}",
        f"  exit code: {_exit_text(code) if code is not None else 'still running'}",
        f"  log: {server.log_path}",
        f"--- last {len(tail)} log lines ---",
        *tail,
        "---",
        f"hint: {hint}",
    ])


def _exit_text(code: int) -> str:
    return f"signal {-code}" if code < 0 else f"exit code {code}"
