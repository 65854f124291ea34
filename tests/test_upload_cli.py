"""``harness upload`` and ``harness serve`` against a live service on loopback.

The commands are invoked as click command objects (the lead registers them in the
``harness`` group); ``serve`` also runs for real in a child process once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import service_helpers
from click.testing import CliRunner, Result
from results_fixtures import make_run

from harness.commands.serve import serve_command
from harness.commands.upload import upload_command
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.settings import TOKEN_ENV, ServiceSettings

TOKEN = "cli-token-" + "z" * 20


@pytest.fixture
def service(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """(base URL, store URL) of a running service."""
    results_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    app = create_app(ServiceSettings(data_dir=tmp_path / "data", token=TOKEN,
                                     results_url=results_url,
                                     report_generator=service_helpers.no_report))
    with serve_in_thread(app) as url:
        yield url, results_url


@pytest.fixture
def run_files(tmp_path: Path) -> tuple[Path, Path]:
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_run("cli-run").to_json()))
    results = tmp_path / "allure-results"
    results.mkdir()
    result_id = str(uuid.uuid4())
    (results / f"{result_id}-result.json").write_text(json.dumps(
        {"uuid": result_id, "name": "test_a", "status": "passed", "stage": "finished"}))
    return run_json, results


def _upload(url: str, files: tuple[Path, Path], *extra: str,
            token: str | None = TOKEN) -> Result:
    run_json, results = files
    return CliRunner().invoke(
        upload_command, ["--url", url, "--run-json", str(run_json), "--results", str(results),
                         *extra],
        env={TOKEN_ENV: token})


def test_upload_then_repeat(service: tuple[str, str], run_files: tuple[Path, Path]) -> None:
    url, results_url = service
    first = _upload(url, run_files)
    assert first.exit_code == 0, first.output
    assert "stored run cli-run (new)" in first.output
    again = _upload(url, run_files)
    assert again.exit_code == 0, again.output
    assert "cli-run was already stored" in again.output
    with open_store(results_url) as store:
        assert [r.run_id for r in store.list_runs()] == ["cli-run"]


def test_wrong_token_exits_1_with_the_servers_reason(service: tuple[str, str],
                                                     run_files: tuple[Path, Path]) -> None:
    url, results_url = service
    answer = _upload(url, run_files, "--token", "not-the-token")
    assert answer.exit_code == 1
    assert "HTTP 401" in answer.output
    assert "bearer token is wrong" in answer.output
    with open_store(results_url) as store:
        assert store.list_runs() == []


def test_bundle_over_the_limit_exits_1_with_413(tmp_path: Path,
                                               run_files: tuple[Path, Path]) -> None:
    app = create_app(ServiceSettings(data_dir=tmp_path / "small", token=TOKEN,
                                     results_url=f"sqlite:///{tmp_path / 'small.sqlite'}",
                                     max_upload_bytes=256,
                                     report_generator=service_helpers.no_report))
    (run_files[1] / "big.txt").write_bytes(os.urandom(4096))
    with serve_in_thread(app) as url:
        answer = _upload(url, run_files)
    assert answer.exit_code == 1
    assert "HTTP 413" in answer.output
    assert "256 bytes" in answer.output


def test_no_token_is_a_usage_error(service: tuple[str, str],
                                   run_files: tuple[Path, Path]) -> None:
    answer = _upload(service[0], run_files, token=None)
    assert answer.exit_code == 2
    assert TOKEN_ENV in answer.output


def test_unreachable_service_names_the_url(run_files: tuple[Path, Path]) -> None:
    url = f"http://127.0.0.1:{service_helpers.free_port()}"
    answer = _upload(url, run_files, "--timeout", "5")
    assert answer.exit_code == 1
    assert f"cannot reach the results service at {url}" in answer.output


def test_serve_refuses_to_start_without_a_token(tmp_path: Path) -> None:
    answer = CliRunner().invoke(serve_command, ["--data-dir", str(tmp_path / "data")],
                                env={TOKEN_ENV: None})
    assert answer.exit_code == 2
    assert f"{TOKEN_ENV} is not set" in answer.output
    assert not (tmp_path / "data").exists()


def test_serve_runs_and_takes_an_upload(tmp_path: Path, run_files: tuple[Path, Path]) -> None:
    port = service_helpers.free_port()
    results_url = f"sqlite:///{tmp_path / 'served.sqlite'}"
    env = {**os.environ, TOKEN_ENV: TOKEN, "HARNESS_CACHE": str(tmp_path / "cache")}
    code = "from harness.commands.serve import serve_command; serve_command()"
    with subprocess.Popen(
            [sys.executable, "-c", code, "--port", str(port), "--data-dir",
             str(tmp_path / "data"), "--results-url", results_url],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT) as server:
        try:
            url = f"http://127.0.0.1:{port}"
            service_helpers.wait_healthy(url, server)
            answer = _upload(url, run_files)
            assert answer.exit_code == 0, answer.output
            assert "(new)" in answer.output
            listed = httpx.get(f"{url}/api/runs", timeout=10).json()["runs"]
            assert [r["run_id"] for r in listed] == ["cli-run"]
        finally:
            server.terminate()
            server.wait(30)
