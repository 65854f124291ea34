"""``harness serve``: the results service under uvicorn.

The upload token is read from ``$HARNESS_SERVICE_TOKEN`` only, never from an option, so
it does not show in process listings or shell history.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import click

from harness.errors import HarnessError
from harness.paths import cache_root
from harness.service.reports import DEFAULT_LEASE_S
from harness.service.settings import (
    DATA_ENV,
    DEFAULT_IDLE_TIMEOUT_S,
    DEFAULT_MAX_UNPACKED_BYTES,
    DEFAULT_MAX_UPLOAD_BYTES,
    IDLE_TIMEOUT_ENV,
    MAX_UPLOAD_ENV,
    TOKEN_ENV,
    ServiceSettings,
)


class _StartRefused(click.ClickException):
    """The service cannot start as configured (exit 2, like the harness's other errors)."""

    exit_code = 2


@click.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on; 0.0.0.0 to accept other machines.")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--data-dir", type=click.Path(path_type=Path, file_okay=False),
              envvar=DATA_ENV, default=None,
              help=f"Where uploaded results and reports are kept [env {DATA_ENV}; "
                   "default: service/ in the harness cache].")
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None,
              help="Results store: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB "
                   "[env HARNESS_RESULTS_URL; default: a SQLite file in the harness cache].")
@click.option("--max-upload-bytes", type=click.IntRange(min=1), envvar=MAX_UPLOAD_ENV,
              default=DEFAULT_MAX_UPLOAD_BYTES, show_default=True,
              help=f"Largest bundle accepted, compressed [env {MAX_UPLOAD_ENV}].")
@click.option("--max-unpacked-bytes", type=click.IntRange(min=1),
              default=DEFAULT_MAX_UNPACKED_BYTES, show_default=True,
              help="Largest total size of a bundle's files once unpacked.")
@click.option("--idle-timeout-s", type=click.FloatRange(min=0, max=3600, min_open=True),
              envvar=IDLE_TIMEOUT_ENV, default=DEFAULT_IDLE_TIMEOUT_S, show_default=True,
              help="Seconds a client may send nothing while it still owes a request's "
                   f"headers or body; then it gets a 408 [env {IDLE_TIMEOUT_ENV}].")
@click.option("--replica", default=None,
              help="This process's name among replicas sharing one store and data dir: "
                   "its report claims and its tmp/ folder carry it; keep it across "
                   "restarts [default: HOSTNAME-PORT].")
@click.option("--report-lease-s", type=click.FloatRange(1, 86400), default=DEFAULT_LEASE_S,
              show_default=True,
              help="Seconds a replica's claim on a report job holds unless renewed: how "
                   "soon another replica takes over the report of one that died.")
def serve_command(*, host: str, port: int, data_dir: Path | None, results_url: str | None,
                  max_upload_bytes: int, max_unpacked_bytes: int,
                  idle_timeout_s: float, replica: str | None,
                  report_lease_s: float) -> None:
    """Run the results service: receives run bundles, stores runs, serves reports.

    Uploads must carry the token in $HARNESS_SERVICE_TOKEN; reading needs none.
    """
    # Imported here: the app pulls in Starlette and the store, which other commands of
    # the harness group do not need.
    import uvicorn  # noqa: PLC0415

    from harness.service.app import create_app  # noqa: PLC0415
    from harness.service.server import server_config  # noqa: PLC0415

    token = os.environ.get(TOKEN_ENV, "")
    if not token.strip():
        raise _StartRefused(f"{TOKEN_ENV} is not set: the service needs a token for "
                            f"uploads; set {TOKEN_ENV} to a long random string (e.g. "
                            "`openssl rand -hex 32`) and give the same to `harness upload`")
    try:
        app = create_app(ServiceSettings(
            data_dir=data_dir if data_dir is not None else cache_root() / "service",
            token=token, results_url=results_url, max_upload_bytes=max_upload_bytes,
            max_unpacked_bytes=max_unpacked_bytes, idle_timeout_s=idle_timeout_s,
            replica=replica if replica is not None else f"{socket.gethostname()}-{port}",
            report_lease_s=report_lease_s))
    except HarnessError as exc:
        raise _StartRefused(str(exc)) from exc
    _log_requests()
    uvicorn.Server(server_config(app, host=host, port=port, log_level="info")).run()


def _log_requests() -> None:
    """The service's own loggers (requests, refusals, reports) print like uvicorn's."""
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    service_log = logging.getLogger("harness.service")
    service_log.addHandler(handler)
    service_log.setLevel(logging.INFO)
