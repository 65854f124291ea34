"""The harness session's options: each ``--harness-*`` flag and its ``HARNESS_*`` variable
go through one parser, and a bad value is one usage error naming it (exit 4), before any
test runs and without a traceback."""

from __future__ import annotations

import argparse

import pytest

from harness.plugin.session import OPTIONS, positive_int, positive_seconds

pytest_plugins = ["pytester"]

TRIVIAL = "def test_trivial():\n    assert True\n"


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("HARNESS_THREADS", "abc", "HARNESS_THREADS='abc': 'abc' is not a whole number"),
    ("HARNESS_THREADS", "0", "HARNESS_THREADS='0': 0 is not at least 1"),
    ("HARNESS_READY_TIMEOUT", "-5", "HARNESS_READY_TIMEOUT='-5': '-5' is not a finite "
     "number of seconds above 0"),
    ("HARNESS_READY_TIMEOUT", "inf", "'inf' is not a finite number of seconds"),
    ("HARNESS_RUNNER", "docker", "HARNESS_RUNNER='docker': 'docker' is not one of "
     "subprocess, container"),
    ("HARNESS_PLANNER_GPU", "RTX", "HARNESS_PLANNER_GPU='RTX'"),
])
def test_a_bad_variable_is_one_usage_error_naming_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, variable: str,
        value: str, message: str) -> None:
    monkeypatch.setenv(variable, value)
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert message in output
    assert "fix or unset it" in output
    assert "Traceback" not in output
    assert "INTERNALERROR" not in output
    assert "passed" not in output


def test_the_flag_wins_over_the_variable(pytester: pytest.Pytester,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    # A bad variable under a good flag is never read.
    monkeypatch.setenv("HARNESS_THREADS", "abc")
    pytester.makepyfile("""
from harness.plugin.session import HarnessSession

def test_threads(pytestconfig):
    assert HarnessSession.of(pytestconfig).options.threads == 3
""")
    result = pytester.runpytest_subprocess("--harness-threads=3")
    result.assert_outcomes(passed=1)


def test_a_bad_flag_is_refused_by_argparse_with_the_same_words(
        pytester: pytest.Pytester) -> None:
    pytester.makepyfile(TRIVIAL)
    result = pytester.runpytest_subprocess("--harness-threads=abc")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*--harness-threads: 'abc' is not a whole number*"])


def test_every_option_has_its_variable() -> None:
    for spec in OPTIONS:
        assert spec.variable == "HARNESS_" + spec.name.upper()
        assert spec.flag == "--harness-" + spec.name.replace("_", "-")


@pytest.mark.parametrize(("parse", "text", "value"), [
    (positive_int, "4", 4), (positive_seconds, "2.5", 2.5), (positive_seconds, "30", 30.0)])
def test_parsers_accept_good_values(parse: object, text: str, value: object) -> None:
    assert callable(parse)
    assert parse(text) == value


@pytest.mark.parametrize(("parse", "text"), [
    (positive_int, "1.5"), (positive_int, "-2"), (positive_seconds, "nan"),
    (positive_seconds, "0")])
def test_parsers_refuse_bad_values(parse: object, text: str) -> None:
    assert callable(parse)
    with pytest.raises(argparse.ArgumentTypeError):
        parse(text)
