"""The harness's plugin drops Hypothesis's pytest plugin from sessions that never use
Hypothesis (harness/plugin/idle_hypothesis.py), and only from those."""

from __future__ import annotations

import sys
import types

import pytest

from harness.plugin.idle_hypothesis import REPORT_KEYS, hypothesis_unused

pytest_plugins = ["pytester"]

#: Says at the end of the session whether Hypothesis's plugin was still registered and
#: whether Hypothesis had been imported.
CONFTEST = """
import sys

def pytest_unconfigure(config):
    registered = config.pluginmanager.get_plugin("hypothesispytest") is not None
    print(f"\\nhypothesis plugin registered: {registered}; "
          f"imported: {'hypothesis' in sys.modules}")
"""

PLAIN = """
def test_plain():
    assert 1 + 1 == 2
"""

WITH_HYPOTHESIS = """
from hypothesis import given, strategies as st

@given(st.integers())
def test_ints(n):
    assert n == n

@given(st.integers(min_value=0))
def test_fails_on_a_big_one(n):
    assert n < 10
"""


def test_a_session_without_hypothesis_drops_its_plugin_and_never_imports_it(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(PLAIN)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*hypothesis plugin registered: False; imported: False*"])


def test_a_session_that_uses_hypothesis_keeps_its_plugin_and_its_report(
        pytester: pytest.Pytester) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(WITH_HYPOTHESIS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    result.assert_outcomes(passed=1, failed=1)
    assert "n=10" in result.stdout.str()  # the shrunk failing example is still reported
    result.stdout.fnmatch_lines(["*hypothesis plugin registered: True; imported: True*"])


def test_a_report_with_hypothesis_data_keeps_the_plugin(monkeypatch: pytest.MonkeyPatch) -> None:
    # The xdist controller never imports Hypothesis; its workers' reports carry its data.
    monkeypatch.delitem(sys.modules, "hypothesis", raising=False)
    plain = types.SimpleNamespace(outcome="passed")
    assert hypothesis_unused([plain]) is True
    for key in REPORT_KEYS:
        carrying = types.SimpleNamespace(outcome="failed", **{key: "[]"})
        assert hypothesis_unused([plain, carrying]) is False
