"""``harness releases`` end to end on real published releases: the pin and two older ones.

b10502 (932 releases before the pin) lacks ``--n-cpu-ffn``, has no MTP path for glm4moe
and gives MTP blocks K/V cells; b10901 (533 before) runs glm4moe's MTP block but still
gives its MTP block K/V cells, the last published release to do so. Each is fetched
from the package index once, built once (ccache shares most objects with the pin), and
a selection of the suites — the tests those differences reach — runs against it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness.releases.published import parse_release
from harness.releases.release_source import pinned_release
from harness.results.release_matrix import Column
from harness.results.release_runs import RELEASES_BRANCH, matrix_from_runs, release_of
from harness.results.store import open_store

HARNESS = str(Path(sys.executable).with_name("harness"))
OLDER = ("10502", "10901")
#: The suites' tests the older releases' differences reach: serving each fixture, the
#: plan reaching the server (the KV model), MTP drafting, the dense FFN split.
SELECTION = "plan_reaches or fixture_serves or mtp or dense"
#: Two builds of about 5 minutes each on 2 cores with a cold compiler cache, and three
#: runs of the selection of about a minute each.
MATRIX_TIMEOUT_S = 2400


@pytest.mark.server
@pytest.mark.timeout(MATRIX_TIMEOUT_S + 60)
def test_release_matrix(tmp_path: Path) -> None:
    """One test, so that xdist never runs the matrix twice on two workers."""
    matrix = _run_matrix(tmp_path / "releases")
    _the_matrix_runs_the_pin_and_two_older_releases(matrix)
    _every_older_failure_is_a_difference_and_every_skip_names_a_feature(matrix)
    _the_oldest_release_skips_what_it_lacks_and_the_kv_model_follows_each_release(matrix)
    _the_stored_runs_give_the_same_matrix(matrix)


def _run_matrix(out: Path) -> dict[str, Any]:
    store = f"sqlite:///{out.parent / 'results.sqlite'}"
    proc = subprocess.run(
        [HARNESS, "releases", "--from", OLDER[0], "--to", OLDER[1], "--every", "1000",
         "--out", str(out), "--workers", "1", "--store", "-k", SELECTION],
        capture_output=True, text=True, timeout=MATRIX_TIMEOUT_S, check=False,
        env={**os.environ, "HARNESS_RESULTS_URL": store})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found: dict[str, Any] = json.loads((out / "matrix.json").read_text())
    found["out"] = out
    found["stdout"] = proc.stdout
    found["store"] = store
    return found


def _the_matrix_runs_the_pin_and_two_older_releases(matrix: dict[str, Any]) -> None:
    releases = [row["release"] for row in matrix["rows"]]
    assert releases == [pinned_release(), *(parse_release(r) for r in OLDER)]
    assert pinned_release() - parse_release(OLDER[0]) > 500
    for row in matrix["rows"]:
        assert row["problem"] is None, row
        assert row["harness errors"] == 0, row
        assert row["passed"] > 0, row
    # One row a release in the table it prints, the pin marked.
    assert f"| b{pinned_release()} (pin) |" in matrix["stdout"]


def _every_older_failure_is_a_difference_and_every_skip_names_a_feature(
        matrix: dict[str, Any]) -> None:
    pin, *older = matrix["rows"]
    assert pin["failed"] == 0, pin
    assert pin["differences"] == 0, pin
    for row in older:
        assert row["failed"] == 0, row  # every failure is one the pin does not share
        record = json.loads(Path(row["record"]).read_text())
        for outcome in record["outcomes"]:
            if outcome["outcome"] == "skipped":
                assert ("not supported by this build" in outcome["message"]
                        or "needs a" in outcome["message"]), outcome
        findings = (Path(row["record"]).parent / "findings.md").read_text()
        assert findings.count("\n- pin: passed") == row["differences"], findings


def _the_oldest_release_skips_what_it_lacks_and_the_kv_model_follows_each_release(
        matrix: dict[str, Any]) -> None:
    rows = {row["release"]: row for row in matrix["rows"]}
    oldest = json.loads(Path(rows[10502]["record"]).read_text())
    skips = {o["test_id"]: o["message"] for o in oldest["outcomes"]
             if o["outcome"] == "skipped"}
    assert any("not supported by this build: --n-cpu-ffn" in m for m in skips.values())
    assert any("--spec-type draft-mtp on glm4moe (from b10603)" in m for m in skips.values())
    # b10901 drafts with glm4moe's MTP block and logs K/V for all three of its blocks;
    # the plan, keyed by release, says three, so the plan reaches the server.
    middle = json.loads(Path(rows[10901]["record"]).read_text())
    mtp_plans = [o for o in middle["outcomes"]
                 if "plan_reaches_the_server[mtp-draft-mtp" in o["test_id"]]
    assert mtp_plans
    assert all(o["outcome"] == "passed" for o in mtp_plans), mtp_plans


def _the_stored_runs_give_the_same_matrix(matrix: dict[str, Any]) -> None:
    """``--store`` kept one run a release under the branch ``releases``; the dashboard's
    matrix, rebuilt from them, counts what the command printed."""
    with open_store(matrix["store"]) as store:
        stored = store.list_runs(branch=RELEASES_BRANCH)
    assert sorted(release_of(run) or 0 for run in stored) == sorted(
        row["release"] for row in matrix["rows"])
    rebuilt = {row.release: row.to_json() for row in matrix_from_runs(stored)}
    for row in matrix["rows"]:
        for column in Column:
            assert rebuilt[row["release"]][column.value] == row[column.value], (row, column)
