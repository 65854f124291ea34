"""The server seam: what every runner and every server it starts look like to the harness.

A runner turns a :class:`LaunchSpec` into a running server (a child process, a container,
or a server the developer started) and guarantees it can be stopped. Fixtures, the
launch supervisor, the A/B runner and the recorder all go through these protocols only,
so a suite runs unchanged whichever runner serves it. The runners implement them
structurally; what they do alike (the port line, log names, the launch, exit cleanup)
lives in :mod:`harness.runners.launching` and :mod:`harness.runners.live`.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Protocol, Self, TypeVar, runtime_checkable

from harness.planning.launch import LaunchSpec


class RunningServer(Protocol):
    """A started server: its address, command line and log, and how to stop it.

    A context manager: leaving the ``with`` block stops it.
    """

    @property
    def argv(self) -> list[str]:
        """The command line the server was (or, for an external one, would be) started with."""
        ...

    @property
    def log_path(self) -> Path: ...

    @property
    def base_url(self) -> str:
        """``http://host:port``; raises ServerError until the server has bound its port."""
        ...

    def host_pid(self) -> int | None:
        """The server's process id as this host sees it (to pin or measure it); None when
        the process is not this host's to know (an external server, a gone container)."""
        ...

    def exit_code(self) -> int | None:
        """None while the server runs; its exit status (negative: the signal) once it ended."""
        ...

    def log_tail(self, lines: int = 40) -> list[str]: ...

    def log_text(self) -> str:
        """The whole log so far (undecodable bytes replaced)."""
        ...

    def stop(self) -> int | None:
        """Stop the server (terminate, wait, kill); idempotent. Returns the exit status."""
        ...

    def __enter__(self) -> Self: ...

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None: ...


class WaitCondition(Protocol):
    """One readiness check (:mod:`harness.runners.readiness` has the standard ones)."""

    def pending(self, server: RunningServer) -> str | None:
        """None when satisfied, else what is still awaited."""
        ...


@runtime_checkable
class TimedCondition(WaitCondition, Protocol):
    """A readiness check that waits on the server, and can be told for how long at most.

    The readiness wait hands it the time left before its deadline, so a check begun
    just before the deadline cannot run past it by its own timeout.
    """

    def pending_within(self, server: RunningServer, timeout_s: float) -> str | None:
        """As ``pending``, waiting ``timeout_s`` at most (less than its own timeout)."""
        ...


ServerT_co = TypeVar("ServerT_co", bound=RunningServer, covariant=True)


class ServerRunner(Protocol[ServerT_co]):
    """Starts servers of one kind; says how long and for what a start is waited on."""

    @property
    def ready_timeout_s(self) -> float: ...

    @property
    def conditions(self) -> Sequence[WaitCondition]:
        """What must hold, in order, before a launched server counts as ready."""
        ...

    def launch(self, spec: LaunchSpec) -> ServerT_co:
        """Start a server for ``spec`` and return at once, without waiting for readiness
        (the caller waits, or stops it)."""
        ...

    def start(self, spec: LaunchSpec) -> ServerT_co:
        """Launch, and return once every condition holds; a server that is not ready in
        time is stopped before the error is raised."""
        ...
