"""A test whose launch needs a feature the build under test lacks: skipped, or failed.

A plan names what the build lacks (``LaunchPlan.unsupported``, "not supported by this
build: --n-cpu-ffn") and is never sent: ``LaunchPlan.ensure_sendable`` raises
``UnsupportedByBuildError`` wherever a plan is launched (the ``launch`` fixture, the
launch supervisor), and ``build_support.ensure_offered`` raises it for a suite whose
purpose is a feature the planner would substitute. One place turns that error into the
test's outcome, whichever fixture or test body raised it: a skip with the plan's words,
or, when the run demands every feature (``--harness-require-features``, as
``--harness-require-gpu`` demands a GPU), a failure naming them, so that a gate cannot
pass by skipping what its build was meant to have.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import NoReturn

import pytest

from harness.errors import UnsupportedByBuildError

#: The option that turns the skip into a failure (harness/plugin/session.py OPTIONS).
REQUIRE_OPTION = "--harness-require-features"


def refuse(error: UnsupportedByBuildError, required: bool) -> NoReturn:
    """Skip the running test with ``error``'s words, or fail it when ``required``."""
    if required:
        pytest.fail(f"this run requires every planned feature ({REQUIRE_OPTION}): {error}",
                    pytrace=False)
    pytest.skip(str(error))


class FeatureGate:
    """The plugin object (registered by ``harness.plugin.hooks``) that does it."""

    def __init__(self, required: bool) -> None:
        self.required = required

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._gate())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: pytest.Item) -> Generator[None, None, None]:
        return (yield from self._gate())

    def _gate(self) -> Generator[None, None, None]:
        try:
            return (yield)
        except UnsupportedByBuildError as error:
            refused = error
        # Outside the handler, so the report shows the reason alone, not the error's
        # traceback chained under it.
        refuse(refused, self.required)
