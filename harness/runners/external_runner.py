"""A runner that starts nothing: tests attach to a llama-server the developer started.

``--harness-external-server URL`` makes every ``start`` return this one server once it
is healthy, so a test can be stepped through against a server running under a debugger
or with extra logging. The server's launch flags are the developer's: the spec a test
asks for is only recorded (its argv goes in the server's note file, as the command that
would match it). Stopping does nothing to the external process, its exit code is always
None, and its "log" is that note: a test that reads the server's log sees no server
output there, and says so when it fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from urllib.parse import urlsplit

from harness.errors import ConfigError, ServerNotReadyError
from harness.planning.launch import LaunchSpec
from harness.runners.base import WaitCondition
from harness.runners.launching import (
    DEFAULT_READY_TIMEOUT_S,
    PreparedLaunch,
    launch_server,
    read_log_tail,
    read_log_text,
    until_ready,
)
from harness.runners.live import forget
from harness.runners.readiness import AddressKnown, HealthOk

#: The binary named in the matching command line when the runner knows of none.
PLACEHOLDER_BINARY = "llama-server"


def check_url(url: str) -> str:
    """``url`` without a trailing slash; ConfigError unless it is http(s)://HOST:PORT."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.path.strip("/"):
        raise ConfigError(f"--harness-external-server {url!r} is not a server address; give "
                          "the llama-server's base URL, e.g. http://127.0.0.1:8080")
    return f"{parts.scheme}://{parts.netloc}"


class ExternalServer:
    """A server someone else started; looks like a ``RunningServer`` to the tests."""

    def __init__(self, url: str, argv: list[str], log_path: Path) -> None:
        self._url = url
        self._argv = argv
        self._log_path = log_path

    @property
    def argv(self) -> list[str]:
        """The command line that would start the server the test asked for (not run)."""
        return list(self._argv)

    @property
    def log_path(self) -> Path:
        return self._log_path

    @property
    def base_url(self) -> str:
        return self._url

    def host_pid(self) -> int | None:
        return None  # not ours to know: the process is the developer's, maybe elsewhere

    def exit_code(self) -> int | None:
        return None  # not ours to know: the process is the developer's

    def log_tail(self, lines: int = 40) -> list[str]:
        return read_log_tail(self._log_path, lines)

    def log_text(self) -> str:
        return read_log_text(self._log_path)

    def stop(self) -> int | None:
        """Leaves the external server running: it was never the harness's to stop."""
        forget(self)
        return None

    def __enter__(self) -> ExternalServer:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


class ExternalRunner:
    """``start(spec)``: the external server at ``url``, once ``/health`` answers 200."""

    def __init__(self, url: str, log_dir: Path, *, binary: Path | None = None,
                 ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
                 conditions: Sequence[WaitCondition] | None = None) -> None:
        self.url = check_url(url)
        self.log_dir = log_dir
        self.binary = str(binary) if binary is not None else PLACEHOLDER_BINARY
        self.ready_timeout_s = ready_timeout_s
        # No ProcessAlive: there is no process of ours whose exit could be seen.
        self.conditions = (tuple(conditions) if conditions is not None
                           else (AddressKnown(), HealthOk()))

    def launch(self, spec: LaunchSpec) -> ExternalServer:
        """The external server, with the note on what was asked for; nothing is started."""
        parts = urlsplit(self.url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        return launch_server(spec, self._note, binary=self.binary, log_dir=self.log_dir,
                             host=parts.hostname or "127.0.0.1", port=port,
                             log_stem="external-server")

    def start(self, spec: LaunchSpec) -> ExternalServer:
        server = self.launch(spec)
        try:
            return until_ready(self, server)
        except ServerNotReadyError as exc:
            raise ServerNotReadyError(
                f"the external llama-server at {self.url} was not ready after "
                f"{self.ready_timeout_s:g}s ({str(exc).splitlines()[0]}); start it first, e.g. "
                f"`{' '.join(server.argv)}`, or point --harness-external-server at the "
                "address it listens on") from exc

    def _note(self, launch: PreparedLaunch) -> ExternalServer:
        launch.log_path.write_text(
            f"external llama-server at {self.url}: started by the developer, not by the "
            "harness, so its own output is not here (see the terminal or file it logs to).\n"
            "The test asked for a server started as:\n"
            f"  {' '.join(launch.argv)}\n"
            "Its launch flags are the developer's responsibility.\n", encoding="utf-8")
        return ExternalServer(self.url, launch.argv, launch.log_path)
