"""What the results service is configured with, checked when it is made."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from harness.errors import ConfigError
from harness.service.layout import DEFAULT_REPLICA, check_replica
from harness.service.reports import DEFAULT_LEASE_S, ReportGenerator, allure_generator

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
    #: This process's name among the replicas sharing the store and the data directory:
    #: its claims on report jobs and its folder under tmp/ carry it. Stable across
    #: restarts (``harness serve`` defaults to host-port), so a restarted replica takes
    #: back its own unfinished work at once.
    replica: str = DEFAULT_REPLICA
    #: Seconds a claim on a report job holds unless renewed: how long after a replica
    #: dies its report in progress is taken over by another.
    report_lease_s: float = DEFAULT_LEASE_S

    def __post_init__(self) -> None:
        if not self.token.strip():
            raise ConfigError(f"the results service needs an upload token: set {TOKEN_ENV} "
                              "to a long random string (clients send it as a bearer token)")
        for name in ("max_upload_bytes", "max_unpacked_bytes", "max_members"):
            if getattr(self, name) < 1:
                raise ConfigError(f"service setting {name} is {getattr(self, name)}; it "
                                  "must be a positive number")
        check_replica(self.replica)
        if not 1 <= self.report_lease_s <= 86400:
            raise ConfigError(f"service setting report_lease_s is {self.report_lease_s}; "
                              "give 1 to 86400 seconds (--report-lease-s)")
        if not 0 < self.idle_timeout_s <= 3600:
            raise ConfigError(f"service setting idle_timeout_s is {self.idle_timeout_s}; "
                              f"give 0 < seconds <= 3600 (--idle-timeout-s / "
                              f"{IDLE_TIMEOUT_ENV})")
