"""Known flakes as data: the file's checks, matching, and what a real pytest run does."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from harness.plugin.flakes import FIELDS, KnownFlakesError, load_known_flakes, parse_known_flakes
from harness.plugin.flakes import SCHEMA as FLAKES_SCHEMA
from harness.plugin.recording.flakes_plugin import DEFAULT_PATH, expired_message, known_flakes_path
from harness.report.allure_meta import category_of
from harness.results.run_record import Hardware

TODAY = dt.date(2026, 11, 29)
H200_BOX = Hardware(host="gpu-7", cpu="AMD EPYC 9654 x192", gpu="NVIDIA H200",
                    gpu_driver="570.1", vram_mib=143771)
CPU_BOX = Hardware(host="vm", cpu="AMD EPYC x2")
ENTRY = """  - test: {test}
    hardware: {hardware}
    reason: races the slot reset
    tracking: https://issues.example.org/llama-harness/7
    expires: {expires}
"""


def _doc(*entries: str) -> str:
    return "flakes:\n" + "".join(entries)


def _entry(test: str = "suites/test_smoke.py::test_a", hardware: str = "any",
           expires: str = "2027-01-31") -> str:
    return ENTRY.format(test=json.dumps(test), hardware=json.dumps(hardware), expires=expires)


def test_the_shipped_list_is_valid_and_empty() -> None:
    flakes = load_known_flakes(DEFAULT_PATH)
    assert flakes.entries == ()
    assert flakes.expired(TODAY) == ()
    assert known_flakes_path(None) == DEFAULT_PATH
    assert known_flakes_path("none") is None
    assert known_flakes_path("") is None


@pytest.mark.parametrize(("text", "expected"), [
    ("flakes: [\n", "not valid YAML"),
    ("- a\n", "$: [\"a\"] is not allowed: ['a'] is not of type 'object'; allowed: type object "
     "(a mapping with one key, flakes: a list of entries (`flakes: []` for none))"),
    ("flakes: []\nflake: []\n", "$.flake: unknown key (value []) is not allowed; allowed keys: "
     "flakes"),
    ("flakes: {}\n", "$.flakes: {} is not allowed: {} is not of type 'array', 'null'; allowed: "
     "type array or null"),
    ("flakes:\n  - just a string\n", "$.flakes[0]: \"just a string\" is not allowed"),
    (_doc(_entry(), ENTRY.replace("    reason: races the slot reset\n", "").format(
        test='"x"', hardware="any", expires="2027-01-01")),
     "$.flakes[1].reason: missing required key; allowed: type string, matching /\\S/ "
     "(a non-empty sentence: why it flakes)"),
    (_doc(_entry().replace("    expires", "    owner: me\n    expires")),
     "$.flakes[0].owner: unknown key (value \"me\") is not allowed; allowed keys: expires, "
     "hardware, reason, test, tracking"),
    (_doc(_entry(test="")), "$.flakes[0].test: \"\" is not allowed"),
    (_doc(_entry(hardware=" ")), "$.flakes[0].hardware: \" \" is not allowed"),
    (_doc(_entry().replace("https://issues.example.org/llama-harness/7", "JIRA-7")),
     "$.flakes[0].tracking: \"JIRA-7\" is not allowed: 'JIRA-7' does not match "),
    (_doc(_entry().replace("https://issues.example.org/llama-harness/7", "JIRA-7")),
     "(a link to the issue that tracks the flake (http(s)://...))"),
    (_doc(_entry(expires="31.01.2027")), "$.flakes[0].expires: \"31.01.2027\" is not allowed: "
     "'31.01.2027' is not a 'date'; allowed: type string, a valid date (a date YYYY-MM-DD: "
     "the last day the entry holds)"),
    (_doc(_entry(expires='"20270131"')), "$.flakes[0].expires: \"20270131\" is not allowed"),
    (_doc(_entry(expires="20270131")), "$.flakes[0].expires: 20270131 is not allowed: "
     "20270131 is not of type 'string'"),
    (_doc(_entry(expires="2027-01-31 10:00:00")),
     "$.flakes[0].expires: \"2027-01-31T10:00:00\" is not allowed"),
    (_doc(_entry(expires="2027-02-30")), "a date in it does not exist"),
    (_doc(_entry(expires='"2027-02-30"')), "$.flakes[0].expires: \"2027-02-30\" is not allowed"),
])
def test_a_malformed_file_names_file_entry_and_field(text: str, expected: str) -> None:
    with pytest.raises(KnownFlakesError) as caught:
        parse_known_flakes(text, "harness/resources/known-flakes.yaml")
    assert str(caught.value).startswith("harness/resources/known-flakes.yaml: ")
    assert expected in str(caught.value)


def test_every_problem_is_named_at_once_with_the_fix() -> None:
    text = _doc(_entry(test=""), _entry(expires="tomorrow"))
    with pytest.raises(KnownFlakesError) as caught:
        parse_known_flakes(text, "f.yaml")
    lines = str(caught.value).splitlines()
    assert [line.split(": ")[1] for line in lines[:-1]] == [
        "$.flakes[0].test", "$.flakes[1].expires"]
    assert lines[-1] == "the fields are described at the top of harness/resources/known-flakes.yaml"


def test_the_schema_has_the_entry_fields() -> None:
    schema = json.loads(FLAKES_SCHEMA.read_text(encoding="utf-8"))
    assert tuple(schema["$defs"]["entry"]["properties"]) == FIELDS
    assert tuple(schema["$defs"]["entry"]["required"]) == FIELDS


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(KnownFlakesError, match=f"cannot read the known-flakes file {tmp_path}"):
        load_known_flakes(tmp_path / "nope.yaml")


def test_dates_quoted_or_not_and_an_empty_list_parse() -> None:
    flakes = parse_known_flakes(_doc(_entry(expires="2027-01-31"),
                                     _entry(expires='"2027-02-01"')), "f")
    assert [e.expires for e in flakes.entries] == [dt.date(2027, 1, 31), dt.date(2027, 2, 1)]
    assert parse_known_flakes("flakes:\n", "f").entries == ()


def test_matching_by_node_id_glob_and_hardware() -> None:
    flakes = parse_known_flakes(_doc(
        _entry(test="suites/test_offload_ladders.py::test_ladder[*]", hardware="*h200*"),
        _entry(test="suites/test_smoke.py::test_fixture_serves[dense]",
               hardware="* on AMD EPYC x2, host *"),
        _entry(test="suites/test_routing.py::*", hardware="any"),
    ), "f")
    ladder = "suites/test_offload_ladders.py::test_ladder[moe-4]"
    assert flakes.match(ladder, H200_BOX) is flakes.entries[0]  # GPU name, any case
    assert flakes.match(ladder, CPU_BOX) is None
    smoke = "suites/test_smoke.py::test_fixture_serves[dense]"
    assert flakes.match(smoke, CPU_BOX) is flakes.entries[1]  # the description
    assert flakes.match(smoke, H200_BOX) is None
    assert flakes.match("suites/test_smoke.py::test_fixture_serves[moe]", CPU_BOX) is None
    assert flakes.match("suites/test_routing.py::test_env_override", H200_BOX) is \
        flakes.entries[2]
    assert flakes.entries[2].outcome_reason() == \
        "known flake: races the slot reset (https://issues.example.org/llama-harness/7)"


def test_an_entry_written_before_the_suites_moved_still_matches() -> None:
    """A list kept from when the suites were harness/suites/ lists the same tests."""
    flakes = parse_known_flakes(_doc(
        _entry(test="harness/suites/test_routing.py::test_env_override")), "f")
    assert flakes.entries[0].test == "suites/test_routing.py::test_env_override"
    assert flakes.match("suites/test_routing.py::test_env_override", CPU_BOX) is \
        flakes.entries[0]


def test_expiry_is_after_the_last_day() -> None:
    flakes = parse_known_flakes(_doc(_entry(expires="2026-11-29"),
                                     _entry(test="t.py::b", expires="2026-11-28")), "f.yaml")
    assert [e.number for e in flakes.expired(TODAY)] == [2]
    message = expired_message(flakes, TODAY)
    assert message is not None
    assert "entry 2 (t.py::b on any): expired 2026-11-28" in message
    assert "renew the entry with a new expires date" in message
    assert expired_message(flakes, TODAY - dt.timedelta(days=2)) is None


# --- a real pytest run ---------------------------------------------------------------------

MODULE = '''
def test_listed_fails():
    assert 1 + 1 == 3, "the slot was reset under us"


def test_listed_passes():
    assert True


def test_unlisted_fails():
    assert False, "a real regression"


def test_other_hardware_fails():
    assert False, "fails here, listed for an H200 only"
'''


@dataclass(frozen=True)
class Run:
    returncode: int
    output: str
    results: Path

    def result(self, name: str) -> dict[str, Any]:
        for path in self.results.glob("*-result.json"):
            body: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
            if body["name"] == name:
                return body
        raise AssertionError(f"no Allure result for {name}:\n{self.output}")


def _run(tmp_path: Path, flakes: str) -> Run:
    (tmp_path / "test_flaky.py").write_text(MODULE)
    (tmp_path / "flakes.yaml").write_text(flakes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["HARNESS_KNOWN_FLAKES"] = str(tmp_path / "flakes.yaml")
    results = tmp_path / "results"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "test_flaky.py", "-rA", "-p", "no:xdist",
         "-p", "no:cacheprovider", f"--alluredir={results}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    return Run(done.returncode, done.stdout + done.stderr, results)


def test_an_expired_entry_fails_the_run_at_session_start(tmp_path: Path) -> None:
    run = _run(tmp_path, _doc(_entry(test="test_flaky.py::test_listed_fails"),
                              _entry(test="test_flaky.py::test_listed_passes",
                                     expires="2020-01-01")))
    assert run.returncode == 4, run.output
    assert "entry 2 (test_flaky.py::test_listed_passes on any): expired 2020-01-01" in run.output
    assert "collected" not in run.output  # stopped before any test ran


def test_a_listed_failure_is_an_xfail_with_its_reason_and_label(tmp_path: Path) -> None:
    run = _run(tmp_path, _doc(
        _entry(test="test_flaky.py::test_listed_*"),
        _entry(test="test_flaky.py::test_other_hardware_fails", hardware="*H200*")))
    assert run.returncode == 1, run.output  # the unlisted failure still fails the gate
    reason = "known flake: races the slot reset (https://issues.example.org/llama-harness/7)"
    assert f"XFAIL test_flaky.py::test_listed_fails - {reason}" in run.output
    assert "PASSED test_flaky.py::test_listed_passes" in run.output
    assert "FAILED test_flaky.py::test_unlisted_fails" in run.output
    assert "FAILED test_flaky.py::test_other_hardware_fails" in run.output
    assert "2 failed, 1 passed, 1 xfailed" in run.output

    flaky = run.result("test_listed_fails")
    assert flaky["status"] == "skipped"
    message = flaky["statusDetails"]["message"]
    assert message.startswith(f"XFAIL {reason}")
    assert "the slot was reset under us" in message  # the failure itself stays visible
    assert [label["value"] for label in flaky["labels"] if label["name"] == "known_flake"] == \
        ["races the slot reset (https://issues.example.org/llama-harness/7)"]
    assert category_of(message, flaky["statusDetails"].get("trace", ""), "skipped") == \
        "Known flake"
    categories = json.loads((run.results / "categories.json").read_text())
    assert categories[0]["name"] == "Known flake"
    for name in ("test_unlisted_fails", "test_other_hardware_fails"):
        failed = run.result(name)
        assert failed["status"] == "failed"
        assert not [label for label in failed["labels"] if label["name"] == "known_flake"]
    assert run.result("test_listed_passes")["status"] == "passed"


def test_a_malformed_list_stops_pytest_with_the_files_words(tmp_path: Path) -> None:
    run = _run(tmp_path, _doc(_entry(expires="soon")))
    assert run.returncode == 4, run.output
    assert (f"{tmp_path / 'flakes.yaml'}: $.flakes[0].expires: \"soon\" is not allowed: "
            "'soon' is not a 'date'; allowed: type string, a valid date (a date YYYY-MM-DD"
            in run.output)
