"""``harness compare`` as CI runs it: exit codes, formats, --output, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from results_fixtures import CPU_BOX, GPU_BOX, at, fig, make_run, outcome

from harness.results.compare_cli import compare_command
from harness.results.model import Hardware
from harness.results.store import open_store

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
