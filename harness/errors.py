"""The harness's error tree: every user-facing failure is one of these.

Each message names the thing that is wrong and what to do about it, so a CI log
read by someone who did not write the harness is enough to act on.
"""

from __future__ import annotations


class HarnessError(Exception):
    """Base of every error the harness raises on purpose."""


class ConfigError(HarnessError):
    """A setting, option or environment variable has a value the harness cannot use."""


class ToolMissingError(HarnessError):
    """A program the harness needs (compiler, CMake, pip) is not installed."""


class SourceError(HarnessError):
    """The llama.cpp source could not be fetched, verified or unpacked."""


class SourceHashMismatchError(SourceError):
    """The downloaded source archive does not hash to the pinned digest."""


class BuildError(HarnessError):
    """CMake configure or build failed, or the built binary does not run."""


class FixtureError(HarnessError):
    """A GGUF fixture or bundle could not be written, found or verified."""


class UnknownFixtureError(FixtureError):
    """A fixture name that no spec defines."""


class ModelFileError(FixtureError):
    """A GGUF file is corrupt, truncated or not a GGUF at all."""


class ServerError(HarnessError):
    """A llama-server process failed to start, died, or never became ready."""


class ServerExitedError(ServerError):
    """The server process exited before it became ready."""


class ServerNotReadyError(ServerError):
    """The server stayed alive but did not become ready within the timeout."""


class ServerStuckError(ServerError):
    """The server did not exit after SIGKILL: the kernel holds it (a driver, I/O)."""


class ServerApiError(HarnessError):
    """The server's HTTP API answered with an error or an unreadable body, or not at all.

    ``status_code``: the HTTP status of an error answer; None when there was none.
    """

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code

    def __reduce__(self) -> tuple[object, ...]:
        # pytest-xdist and multiprocessing pickle errors: keep the status across.
        return (type(self), (str(self), self.status_code))


class ServiceError(HarnessError):
    """The results service did not answer a call as it should: no answer, none in time,
    too long an answer, an error status, or a body that is not JSON of finite numbers.

    The message names the service, the call and what happened; ``what`` is that last
    part alone, ``status_code`` the HTTP status of an error answer (None without one).
    """

    def __init__(self, message: str, what: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.what = what
        self.status_code = status_code

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (str(self), self.what, self.status_code))


class UnsupportedByBuildError(HarnessError):
    """A launch needs features the build under test does not offer, so it is not sent.

    ``features`` names each the way a user types it (``--n-cpu-ffn``, ``--spec-type
    draft-mtp``); the message is the plan's own words for them.
    """

    def __init__(self, features: tuple[str, ...], message: str) -> None:
        super().__init__(message)
        self.features = features


class CannotRunHereError(UnsupportedByBuildError):
    """The build died of an instruction this host's CPU lacks (SIGILL): it cannot run
    here. ``features`` names the missing instruction sets. A test skips with it like a
    feature the build lacks, and fails under ``--harness-require-features``."""
