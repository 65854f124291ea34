"""``harness compare`` as CI runs it: exit codes, formats, --output, errors, --service."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import service_helpers
from click.testing import CliRunner, Result
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, make_run, outcome

from harness.commands.compare import compare_command
from harness.results.run_record import Hardware
from harness.results.store import open_store
from harness.service.app import create_app
from harness.service.background import serve_in_thread
from harness.service.settings import ServiceSettings

DECODE = (1000.0, 1012.0, 988.0, 995.0, 1005.0)


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A SQLite store with five main runs (decode ~1000 tokens/s, tests passing)."""
    store_url = f"sqlite:///{tmp_path / 'results.sqlite'}"
    with open_store(store_url) as store:
        for i, value in enumerate(DECODE):
            store.add_run(make_run(f"main-{i}", started_at=at(i), outcomes=[outcome("t::a")],
                                   figures=[fig("decode_tps", value)]))
    return store_url


def _add(url: str, run_id: str, decode: float, result: str = "passed", *,
         hardware: Hardware = CPU_BOX) -> None:
    with open_store(url) as store:
        store.add_run(make_run(run_id, branch="feature", started_at=at(50), hardware=hardware,
                               outcomes=[outcome("t::a", result)],
                               figures=[fig("decode_tps", decode)]))


def _run(url: str | None, *args: str, env: dict[str, str] | None = None) -> Result:
    full = [*args, "--results-url", url] if url else list(args)
    return CliRunner().invoke(compare_command, full, env=env, catch_exceptions=False)


def test_a_regression_exits_1_with_a_markdown_report(url: str) -> None:
    _add(url, "pr-1", 850.0)
    result = _run(url, "--baseline", "main")
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("## ❌ Regressed")
    assert "`pr-1`" in result.stdout
    assert "`main-4`" in result.stdout


def test_no_regression_exits_0(url: str) -> None:
    _add(url, "pr-1", 995.0)
    result = _run(url, "--baseline", "latest")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("## ✅ No regression")


def test_a_newly_failing_test_alone_exits_1(url: str) -> None:
    _add(url, "pr-1", 1000.0, "failed")
    result = _run(url, "--baseline", "main-4", "--format", "json")
    assert result.exit_code == 1, result.output
    body = json.loads(result.stdout)
    assert [t["test_id"] for t in body["tests"]["newly_failing"]] == ["t::a"]
    assert body["baseline_runs"] == ["main-4", "main-3", "main-2", "main-1", "main-0"]


def test_json_format_and_noise_options(url: str) -> None:
    _add(url, "pr-1", 850.0)
    # A 20 % threshold lets the 15 % slowdown through as noise.
    result = _run(url, "--baseline", "main", "--format", "json", "--threshold", "0.2")
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert body["regressed"] is False
    assert body["rule"] == {"threshold": 0.2, "z": 3.0, "min_runs": 3}
    assert body["current_run"] == "pr-1"
    # Too few baseline runs in the window: not judged.
    short = json.loads(_run(url, "--baseline", "main", "--format", "json",
                            "--window", "2").stdout)
    assert short["figures"][0]["status"] == "no baseline"


def test_current_can_be_named(url: str) -> None:
    _add(url, "pr-1", 850.0)
    result = _run(url, "--baseline", "main-3", "--current", "main-4", "--format", "json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["current_run"] == "main-4"


def test_output_file_gets_the_report_too(url: str, tmp_path: Path) -> None:
    _add(url, "pr-1", 850.0)
    summary = tmp_path / "summary.md"
    summary.write_text("stale\n")
    result = _run(url, "--baseline", "main", "--output", str(summary))
    assert result.exit_code == 1
    assert summary.read_text() == result.stdout


def test_results_url_from_the_environment(url: str) -> None:
    _add(url, "pr-1", 850.0)
    result = _run(None, "--baseline", "main", env={"HARNESS_RESULTS_URL": url})
    assert result.exit_code == 1, result.output


def test_unknown_selector_exits_2_listing_what_exists(url: str) -> None:
    _add(url, "pr-1", 850.0)
    result = _run(url, "--baseline", "nope")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.startswith("error: baseline 'nope'")
    assert "main" in result.stderr
    assert "pr-1" in result.stderr


def test_unknown_current_exits_2(url: str) -> None:
    result = _run(url, "--baseline", "main", "--current", "ghost")
    assert result.exit_code == 2
    assert "--current 'ghost'" in result.stderr


def test_empty_store_exits_2(tmp_path: Path) -> None:
    result = _run(f"sqlite:///{tmp_path / 'empty.sqlite'}", "--baseline", "main")
    assert result.exit_code == 2
    assert "holds no runs" in result.stderr


def test_other_hardware_exits_2(url: str) -> None:
    _add(url, "gpu-1", 850.0, hardware=GPU_BOX)
    result = _run(url, "--baseline", "main-4", "--current", "gpu-1")
    assert result.exit_code == 2
    assert GPU_BOX.describe() in result.stderr


def test_unreachable_store_exits_2_without_the_password() -> None:
    result = _run("postgresql://ci:hunter2-pw@127.0.0.1:1/results", "--baseline", "main")
    assert result.exit_code == 2
    assert "127.0.0.1:1" in result.stderr
    assert "hunter2-pw" not in result.output


def test_unwritable_output_exits_2(url: str, tmp_path: Path) -> None:
    _add(url, "pr-1", 995.0)
    result = _run(url, "--baseline", "main", "--output", str(tmp_path / "missing" / "x.md"))
    assert result.exit_code == 2
    assert "--output" in result.stderr


@pytest.mark.parametrize(("args", "says"), [
    ((), "--baseline SELECTOR: `latest`"),
    (("--baseline", "main", "--window", "0"), "--window"),
    (("--baseline", "main", "--format", "html"), "--format"),
    (("--baseline", "main", "--min-runs", "1"), "--min-runs"),
])
def test_usage_errors_exit_2_and_name_the_option(url: str, args: tuple[str, ...],
                                                 says: str) -> None:
    result = _run(url, *args)
    assert result.exit_code == 2
    assert says in result.stderr


# -- --service: the same comparison asked of the results service -------------------

TOKEN = "compare-token-" + "q" * 20


@pytest.fixture
def service(url: str, tmp_path: Path) -> Iterator[str]:
    """The base URL of a live results service over the ``url`` store."""
    app = create_app(ServiceSettings(data_dir=tmp_path / "service", token=TOKEN,
                                     results_url=url, report_generator=service_helpers.no_report))
    with serve_in_thread(app) as base:
        yield base


def _ask(service_url: str, *args: str) -> Result:
    return CliRunner().invoke(compare_command, [*args, "--service", service_url],
                              catch_exceptions=False)


def test_service_regression_exits_1_with_markdown_and_a_report_link(
        url: str, service: str, tmp_path: Path) -> None:
    _add(url, "pr-1", 850.0)
    summary = tmp_path / "summary.md"
    result = _ask(service, "--baseline", "main", "--current", "pr-1", "--output", str(summary))
    assert result.exit_code == 1, result.output
    assert result.stdout.startswith("## ❌ Regressed")
    assert "`pr-1`" in result.stdout
    assert "`main-4`" in result.stdout
    assert f"{service}/runs/pr-1/report/" in result.stdout
    assert summary.read_text() == result.stdout


def test_service_json_matches_the_local_comparison(url: str, service: str) -> None:
    _add(url, "pr-1", 995.0)
    remote = _ask(service, "--baseline", "main", "--current", "pr-1", "--format", "json",
                  "--window", "4", "--threshold", "0.1", "--z", "2", "--min-runs", "2")
    assert remote.exit_code == 0, remote.output
    local = _run(url, "--baseline", "main", "--current", "pr-1", "--format", "json",
                 "--window", "4", "--threshold", "0.1", "--z", "2", "--min-runs", "2")
    # The noise options reach the service: the bodies agree field for field.
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    assert json.loads(remote.stdout)["rule"] == {"threshold": 0.1, "z": 2.0, "min_runs": 2}


def test_service_newly_failing_test_exits_1(url: str, service: str) -> None:
    _add(url, "pr-1", 1000.0, "failed")
    result = _ask(service, "--baseline", "main", "--current", "pr-1", "--format", "json")
    assert result.exit_code == 1, result.output
    assert json.loads(result.stdout)["regressed"] is True


def test_service_other_hardware_exits_2_with_the_services_message(url: str,
                                                                  service: str) -> None:
    _add(url, "gpu-1", 850.0, hardware=GPU_BOX)
    result = _ask(service, "--baseline", "main-4", "--current", "gpu-1")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert "HTTP 409" in result.stderr
    assert GPU_BOX.describe() in result.stderr
    assert "main-4" in result.stderr


def test_service_unknown_baseline_exits_2_listing_what_exists(url: str, service: str) -> None:
    _add(url, "pr-1", 850.0)
    result = _ask(service, "--baseline", "nope", "--current", "pr-1")
    assert result.exit_code == 2
    assert "HTTP 404" in result.stderr
    assert "baseline 'nope'" in result.stderr


def test_service_unknown_current_exits_2(service: str) -> None:
    result = _ask(service, "--baseline", "main", "--current", "ghost")
    assert result.exit_code == 2
    assert "'ghost'" in result.stderr


def test_unreachable_service_exits_2_naming_the_url() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gone = f"http://127.0.0.1:{port}"
    result = _ask(gone, "--baseline", "main", "--current", "pr-1")
    assert result.exit_code == 2
    assert f"cannot reach the results service at {gone}" in result.stderr


def test_a_server_that_is_not_the_service_exits_2(tmp_path: Path) -> None:
    async def not_the_service(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/html")]})
        await send({"type": "http.response.body", "body": b"<html>hello</html>"})

    with serve_in_thread(not_the_service) as other:
        result = _ask(other, "--baseline", "main", "--current", "pr-1")
    assert result.exit_code == 2
    assert "GET /api/compare sent a body that is not JSON" in result.stderr
    assert "is --service the address of `harness serve`?" in result.stderr


@pytest.mark.parametrize(("args", "says"), [
    (("--baseline", "main"), "--service needs --current RUN_ID"),
    (("--baseline", "main", "--current", "pr-1", "--results-url", "sqlite:///x.sqlite"),
     "give one"),
])
def test_service_usage_errors_exit_2(args: tuple[str, ...], says: str) -> None:
    result = _ask("http://127.0.0.1:9", *args)
    assert result.exit_code == 2
    assert says in result.stderr
