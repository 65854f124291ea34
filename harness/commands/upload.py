"""``harness upload``: send a run (its run.json and allure-results) to the results service."""

from __future__ import annotations

import tempfile
from pathlib import Path

import click

from harness.errors import HarnessError
from harness.service.bundle import make_bundle
from harness.service.settings import TOKEN_ENV
from harness.service.upload_client import DEFAULT_TIMEOUT_S, upload_bundle

URL_ENV = "HARNESS_SERVICE_URL"


@click.command("upload")
@click.option("--url", envvar=URL_ENV, required=True,
              help=f"The results service, e.g. http://127.0.0.1:8080 [env {URL_ENV}].")
@click.option("--run-json", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              required=True, help="The run.json the harness wrote for the run.")
@click.option("--results", type=click.Path(path_type=Path, file_okay=False, exists=True),
              required=True, help="The run's allure-results directory.")
@click.option("--token", envvar=TOKEN_ENV, default=None,
              help=f"The service's upload token [env {TOKEN_ENV}].")
@click.option("--timeout", "timeout_s", type=click.FloatRange(min=1),
              default=DEFAULT_TIMEOUT_S, show_default=True,
              help="Seconds the whole upload may take: sending the bundle and the answer.")
def upload_command(*, url: str, run_json: Path, results: Path, token: str | None,
                   timeout_s: float) -> None:
    """Send a run (run.json + allure-results) to the results service.

    Exit 0 when the service has the run (new or already stored), 1 when it refused the
    upload or could not be reached.
    """
    if not token:
        raise click.UsageError(f"no upload token: pass --token or set {TOKEN_ENV} to the "
                               "token the service was started with")
    try:
        with tempfile.TemporaryDirectory(prefix="harness-upload-") as tmp:
            bundle = make_bundle(run_json, results, Path(tmp) / "bundle.tar.gz")
            result = upload_bundle(url, bundle, token, timeout_s=timeout_s)
    except HarnessError as exc:
        raise click.ClickException(str(exc)) from exc
    if result.created:
        click.echo(f"stored run {result.run_id} (new)")
    else:
        click.echo(f"run {result.run_id} was already stored (unchanged)")
    click.echo(f"run: {result.run_url}")
    if result.report.get("state") == "pending":
        click.echo(f"report: {url.rstrip('/')}/runs/{result.run_id}/report/ (being made)")
