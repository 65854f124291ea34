"""HARNESS_TEST_REQUIRE turns "skipped: X is missing" into a failure naming X.

Each case runs a small pytest session in a subprocess (pytester) whose tests ask for a
resource that is missing there, with and without the variable.
"""

from __future__ import annotations

import pytest

from harness.plugin.required import REQUIRE_ENV, RequireSettingError, required_resources

pytest_plugins = ["pytester"]

NEEDS_POSTGRES = """
from harness.plugin.required import skip_unless_present

def test_needs_postgres():
    skip_unless_present("postgres", "no PostgreSQL here: set HARNESS_TEST_POSTGRES_URL")

def test_has_allure():
    skip_unless_present("allure", None)
"""

DOCKER_MARKED = """
import pytest

@pytest.mark.docker
def test_in_docker():
    pass
"""


def test_without_the_variable_a_missing_resource_skips(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REQUIRE_ENV, raising=False)
    pytester.makepyfile(NEEDS_POSTGRES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*no PostgreSQL here*"])


def test_a_required_resource_that_is_missing_fails_and_names_itself(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "docker,postgres")
    pytester.makepyfile(NEEDS_POSTGRES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines([
        f"*{REQUIRE_ENV} requires postgres, but it is missing: no PostgreSQL here*"])


def test_a_required_resource_not_named_still_skips(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "chromium")
    pytester.makepyfile(NEEDS_POSTGRES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1, skipped=1)


def test_the_docker_marker_fails_without_an_engine_when_docker_is_required(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # A socket nobody serves: the engine check answers "unavailable" at once.
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent-harness-test/docker.sock")
    monkeypatch.setenv(REQUIRE_ENV, "docker")
    pytester.makepyfile(DOCKER_MARKED)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    # Failed in setup, where the marker is checked: pytest counts that as an error.
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines([f"*{REQUIRE_ENV} requires docker, but it is missing*"])


def test_an_unknown_name_stops_the_session_before_any_test(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_ENV, "docker,postgress")
    pytester.makepyfile(NEEDS_POSTGRES)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "postgress" in result.stderr.str() + result.stdout.str()


@pytest.mark.parametrize(("value", "names"), [
    ("", frozenset()),
    ("docker, Postgres ,,", frozenset({"docker", "postgres"})),
    ("docker,postgres,chromium,allure", frozenset({"docker", "postgres", "chromium", "allure"})),
])
def test_the_setting_is_a_comma_separated_set(value: str, names: frozenset[str]) -> None:
    assert required_resources(value) == names


def test_an_unknown_name_is_an_error_listing_the_allowed_ones() -> None:
    with pytest.raises(RequireSettingError, match="allowed: docker, postgres, chromium, allure"):
        required_resources("gpu")
