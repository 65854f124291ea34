"""Drops Hypothesis's pytest plugin from a session that never used Hypothesis.

That plugin imports the whole of Hypothesis in its terminal summary (to list the
observability files written in this process): about 1.4 s of every suite session on a
2-core runner, where the suites never use Hypothesis. A gate, a nightly cell, a bisect
probe and a release row each start such sessions. When this process never imported
Hypothesis and no test report carries its statistics or failing examples, that summary
would print nothing, so the plugin is unregistered before it runs.
"""

from __future__ import annotations

import sys

import pytest

#: Hypothesis's pytest plugin, by the name its ``pytest11`` entry point registers.
HYPOTHESIS_PLUGIN = "hypothesispytest"
#: What Hypothesis attaches to a report for its terminal summary
#: (``_hypothesis_pytestplugin.STATS_KEY`` and ``FAILING_EXAMPLES_KEY``).
REPORT_KEYS = ("_hypothesis_stats", "_hypothesis_failing_examples")


def hypothesis_unused(reports: list[object]) -> bool:
    """Nothing in this process imported Hypothesis and no report (a worker's included)
    carries what its summary would print."""
    if "hypothesis" in sys.modules:
        return False
    return not any(key in vars(report) for report in reports for key in REPORT_KEYS
                   if hasattr(report, "__dict__"))


class IdleHypothesis:
    """Registered by the harness's plugin; acts at the end of the session."""

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        # Runs inside the terminal reporter's sessionfinish wrapper, before it calls the
        # terminal summary hooks.
        manager = session.config.pluginmanager
        plugin = manager.get_plugin(HYPOTHESIS_PLUGIN)
        if plugin is None:
            return
        reporter = manager.get_plugin("terminalreporter")
        stats = getattr(reporter, "stats", {})
        reports = [report for found in stats.values() for report in found]
        if hypothesis_unused(reports):
            manager.unregister(plugin)
