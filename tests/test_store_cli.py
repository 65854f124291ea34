"""``harness store RUN_JSON`` through click: new, repeated and broken run records (a
refusal names the file and the JSON path of the field)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from results_fixtures import fig, make_run, outcome

from harness.commands.store import store_command
from harness.results.store import open_store


def _store_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'results.sqlite'}"


def _write_run(path: Path) -> Path:
    run = make_run("run-7", branch="feature/y",
                   outcomes=[outcome("suites/test_smoke.py::test_a"),
                             outcome("suites/test_smoke.py::test_b", "failed")],
                   figures=[fig("decode_tps", 800.0), fig("ttft_ms", 3.0), fig("kv_mib", 0.1)])
    path.write_text(json.dumps(run.to_json()), encoding="utf-8")
    return path


def test_a_run_is_stored_once_and_then_left_as_it_is(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    url = _store_url(tmp_path)
    first = CliRunner().invoke(store_command, [str(run_json), "--results-url", url])
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("stored: run run-7 (feature/y, 2 tests, 3 figures)"), \
        first.stdout
    again = CliRunner().invoke(store_command, [str(run_json), "--results-url", url])
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("already stored: run run-7"), again.stdout
    with open_store(url) as store:
        kept = store.get_run("run-7")
    assert kept is not None
    assert (kept.branch, len(kept.outcomes), len(kept.figures)) == ("feature/y", 2, 3)


def test_the_store_url_can_come_from_the_environment(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    url = _store_url(tmp_path)
    done = CliRunner().invoke(store_command, [str(run_json)],
                              env={"HARNESS_RESULTS_URL": url})
    assert done.exit_code == 0, done.output
    with open_store(url) as store:
        assert store.get_run("run-7") is not None


def _fails_naming(run_json: Path, tmp_path: Path, words: str) -> None:
    done = CliRunner().invoke(store_command, [str(run_json), "--results-url",
                                              _store_url(tmp_path)])
    assert done.exit_code == 2, done.output
    assert done.stderr.startswith("error: "), done.stderr
    assert str(run_json) in done.stderr
    assert words in done.stderr
    assert "Traceback" not in done.output


def test_a_truncated_run_json_is_an_error_naming_the_file(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    text = run_json.read_text(encoding="utf-8")
    run_json.write_text(text[: len(text) // 2], encoding="utf-8")
    _fails_naming(run_json, tmp_path, "is not a harness run record")


def test_a_run_json_without_a_run_id_is_an_error_naming_the_file(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    body = json.loads(run_json.read_text(encoding="utf-8"))
    del body["run_id"]
    run_json.write_text(json.dumps(body), encoding="utf-8")
    _fails_naming(run_json, tmp_path, "$.run_id: missing")


def test_a_missing_run_json_is_an_error_naming_the_file(tmp_path: Path) -> None:
    _fails_naming(tmp_path / "nowhere" / "run.json", tmp_path, "cannot read the run record")


def test_a_broken_run_json_stores_nothing(tmp_path: Path) -> None:
    run_json = tmp_path / "run.json"
    run_json.write_text('{"run_id": "half", "branch": ', encoding="utf-8")
    url = _store_url(tmp_path)
    assert CliRunner().invoke(store_command, [str(run_json), "--results-url", url]).exit_code == 2
    with open_store(url) as store:
        assert store.get_run("half") is None


def test_a_run_json_with_infinity_is_refused_naming_the_field(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    body = json.loads(run_json.read_text(encoding="utf-8"))
    body["figures"][1]["value"] = "@@inf@@"
    run_json.write_text(json.dumps(body).replace('"@@inf@@"', "Infinity"), encoding="utf-8")
    _fails_naming(run_json, tmp_path, "$.figures[1].value: Infinity is not allowed")
    with open_store(_store_url(tmp_path)) as store:
        assert store.get_run("run-7") is None


def test_a_run_json_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    run_json.write_bytes(run_json.read_bytes().replace(b"feature/y", b"feature/\xff"))
    _fails_naming(run_json, tmp_path, "is not UTF-8")


def test_a_run_json_with_a_wrong_type_names_the_field(tmp_path: Path) -> None:
    run_json = _write_run(tmp_path / "run.json")
    body = json.loads(run_json.read_text(encoding="utf-8"))
    body["outcomes"][0]["duration_s"] = True
    run_json.write_text(json.dumps(body), encoding="utf-8")
    _fails_naming(run_json, tmp_path, "$.outcomes[0].duration_s: true is not allowed")


def test_several_runs_are_stored_at_once_and_a_bad_one_stores_none(tmp_path: Path) -> None:
    url = _store_url(tmp_path)
    first = _write_run(tmp_path / "first.json")
    body = json.loads(first.read_text(encoding="utf-8"))
    body["run_id"] = "run-8"
    second = tmp_path / "second.json"
    second.write_text(json.dumps(body), encoding="utf-8")
    broken = tmp_path / "broken.json"
    broken.write_text('{"run_id": "half"', encoding="utf-8")
    refused = CliRunner().invoke(store_command, [str(first), str(broken), str(second),
                                                 "--results-url", url])
    assert refused.exit_code == 2, refused.output
    assert str(broken) in refused.stderr
    with open_store(url) as store:
        assert store.get_run("run-7") is None  # checked before anything was stored
    done = CliRunner().invoke(store_command, [str(first), str(second), str(first),
                                              "--results-url", url])
    assert done.exit_code == 0, done.output
    assert [line.split(" (")[0] for line in done.stdout.splitlines()] == [
        "stored: run run-7", "stored: run run-8", "already stored: run run-7"]
    with open_store(url) as store:
        assert {run.run_id for run in store.list_runs()} == {"run-7", "run-8"}
