"""The report's picture of the run's figures against its baseline (a global attachment).

Three earlier runs of a branch are stored, then a run whose decode speed dropped: the
picture judges it with the gate's rule, and ``harness report`` (given the run record and
the store) renders it into the Allure report, whose files then hold those exact bytes.
"""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import pytest
from checkout import allure_missing
from click.testing import CliRunner
from results_fixtures import at, fig, make_run
from test_report import run_tiny_suite

from harness.commands.report import report_command
from harness.files import write_json_atomic
from harness.plugin.required import skip_unless_present
from harness.report.baseline_figures import ATTACHMENT_NAME, baseline_attachment, baseline_runs
from harness.results.run_record import RunRecord
from harness.results.store import open_store

PNG = b"\x89PNG\r\n\x1a\n"


def _runs() -> tuple[list[RunRecord], RunRecord]:
    earlier = [make_run(f"night-{i}", branch="nightly/x", started_at=at(i),
                        figures=[fig("decode_tps", v), fig("ttft_ms", 20.0)])
               for i, v in enumerate((100.0, 101.0, 99.0))]
    now = make_run("night-3", branch="nightly/x", started_at=at(3),
                   figures=[fig("decode_tps", 70.0), fig("ttft_ms", 20.5)])
    return earlier, now


def test_the_picture_needs_a_baseline_and_is_a_png(tmp_path: Path) -> None:
    earlier, now = _runs()
    assert baseline_attachment(now, []) is None
    picture = baseline_attachment(now, list(reversed(earlier)))
    assert picture is not None
    assert (picture.name, picture.mime) == (ATTACHMENT_NAME, "image/png")
    assert picture.data.startswith(PNG)
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with open_store(url) as store:
        for run in (*earlier, now, replace(make_run("other-branch", started_at=at(2)))):
            store.add_run(run)
        assert [r.run_id for r in baseline_runs(now, store)] == ["night-2", "night-1",
                                                                  "night-0"]


def test_harness_report_puts_the_picture_on_the_reports_front_page(tmp_path: Path) -> None:
    skip_unless_present("allure", allure_missing())
    results = run_tiny_suite(tmp_path / "tiny", tmp_path / "results")
    earlier, now = _runs()
    url = f"sqlite:///{tmp_path / 'r.sqlite'}"
    with open_store(url) as store:
        for run in (*earlier, now):
            store.add_run(run)
    record = tmp_path / "run.json"
    write_json_atomic(record, now.to_json())
    before = sorted(p.name for p in results.iterdir())
    done = CliRunner().invoke(report_command, [
        "--results", str(results), "--output", str(tmp_path / "report"),
        "--history", str(tmp_path / "history.jsonl"), "--run-record", str(record),
        "--results-url", url])
    assert done.exit_code == 0, done.output
    assert sorted(p.name for p in results.iterdir()) == before, "the results stay as given"
    picture = baseline_attachment(now, list(reversed(earlier)))
    assert picture is not None
    shipped = [p for p in (tmp_path / "report").rglob("*") if p.is_file()
               and p.read_bytes()[:8] == PNG and p.read_bytes() == picture.data]
    assert shipped, "the report holds the picture's bytes"
    shutil.rmtree(tmp_path / "report")


def test_a_store_that_cannot_be_read_costs_only_the_picture(tmp_path: Path) -> None:
    skip_unless_present("allure", allure_missing())
    results = run_tiny_suite(tmp_path / "tiny", tmp_path / "results")
    _, now = _runs()
    record = tmp_path / "run.json"
    write_json_atomic(record, now.to_json())
    done = CliRunner().invoke(report_command, [
        "--results", str(results), "--output", str(tmp_path / "report"),
        "--history", str(tmp_path / "history.jsonl"), "--run-record", str(record),
        "--results-url", "postgresql://nobody:x@127.0.0.1:9/none"])
    assert done.exit_code == 0, done.output
    assert "no picture of the figures against the baseline" in done.stderr
    assert (tmp_path / "report" / "index.html").is_file()


@pytest.fixture(autouse=True)
def _quiet_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
