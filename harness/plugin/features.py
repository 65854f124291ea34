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

from harness.builds.under_test import BuildUnderTest
from harness.errors import UnsupportedByBuildError
from harness.facts.build import Capabilities
from harness.planning.build_support import ensure_supported
from harness.planning.launch import LaunchSpec
from harness.probes.gguf_facts import read_model_facts

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


def ensure_launchable(spec: LaunchSpec, capabilities: Capabilities,
                      build: BuildUnderTest) -> None:
    """Raise ``UnsupportedByBuildError`` for a spec the build (or its release, for this
    model) cannot run: the last check before the fixtures start a server."""
    # The model's architecture matters only where a release lacks a spec type for some
    # models (release_rules.release_lacks): read the header only then.
    architecture = (read_model_facts(spec.model).architecture
                    if spec.spec_type and build.release is not None else "")
    ensure_supported(spec, capabilities, release=build.release, architecture=architecture)
