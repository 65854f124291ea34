"""What the results service is configured with, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import ConfigError
from harness.service.reports import ReportGenerator, allure_generator

MIB = 1024 * 1024

TOKEN_ENV = "HARNESS_SERVICE_TOKEN"
DATA_ENV = "HARNESS_SERVICE_DATA"
MAX_UPLOAD_ENV = "HARNESS_SERVICE_MAX_UPLOAD"
IDLE_TIMEOUT_ENV = "HARNESS_SERVICE_IDLE_TIMEOUT"

DEFAULT_MAX_UPLOAD_BYTES = 64 * MIB
#: Allure results are JSON and text, which compress several times over; a bundle that
#: unpacks to more than this is refused whatever its compressed size.
DEFAULT_MAX_UNPACKED_BYTES = 512 * MIB
DEFAULT_MAX_MEMBERS = 50_000
#: Long enough for a runner on a slow link between two chunks, short enough that
#: stalled clients cannot pile up sockets and temp files.
DEFAULT_IDLE_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class ServiceSettings:
    data_dir: Path
    #: The bearer token uploads must carry.
    token: str
    #: Results store URL; None is the store's default (``$HARNESS_RESULTS_URL`` or a
    #: SQLite file in the harness cache).
    results_url: str | None = None
    #: Largest request body ``POST /api/runs`` reads, compressed.
    max_upload_bytes: int = DEFAULT_MAX_UPLOAD_BYTES
    #: Largest total size of a bundle's files once unpacked.
    max_unpacked_bytes: int = DEFAULT_MAX_UNPACKED_BYTES
    max_members: int = DEFAULT_MAX_MEMBERS
    #: Seconds a client may go without sending a byte while it still owes the request's
    #: headers or body; then it gets a 408 and the connection is closed.
    idle_timeout_s: float = DEFAULT_IDLE_TIMEOUT_S
    report_generator: ReportGenerator = field(default=allure_generator)

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ConfigError(f"the results service needs an upload token: set {TOKEN_ENV} "
                              "to a long random string (clients send it as a bearer token)")
        for name in ("max_upload_bytes", "max_unpacked_bytes", "max_members"):
            if getattr(self, name) < 1:
                raise ConfigError(f"service setting {name} is {getattr(self, name)}; it "
                                  "must be a positive number")
        if not 0 < self.idle_timeout_s <= 3600:
            raise ConfigError(f"service setting idle_timeout_s is {self.idle_timeout_s}; "
                              f"give 0 < seconds <= 3600 (--idle-timeout-s / "
                              f"{IDLE_TIMEOUT_ENV})")
