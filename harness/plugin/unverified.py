"""Planned fields the build under test cannot show: one summary line per field and reason.

A plan-forwarding test leaves a field it cannot verify out of its comparison and says so
(``harness.verdicts.unverifiable_fields``): the detail goes to its Allure result, and the
field goes here through the ``unverified_fields`` fixture as a user property. Reports carry
user properties from xdist workers to the controller, which counts them and prints, at
the end of the run, one line per field and reason with the number of tests it touched —
instead of one warning per test that repeats the same few reasons.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import pytest

#: The user-property name a test's unverified fields travel under.
PROPERTY = "harness_unverified_fields"

#: What the fixture hands a test: record these fields (name → reason) as unverified.
RecordUnverified = Callable[[Mapping[str, str]], None]


def summary_lines(per_test: Mapping[str, Mapping[str, str]]) -> list[str]:
    """One line per (field, reason), most tests first, from each test's fields (pure)."""
    counts: dict[tuple[str, str], int] = {}
    for fields in per_test.values():
        for name, why in fields.items():
            counts[(name, why)] = counts.get((name, why), 0) + 1
    ordered = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return [f"{name} ({count} test{'s' if count != 1 else ''}): {why}"
            for (name, why), count in ordered]


def _fields_of(properties: Iterable[tuple[str, object]]) -> dict[str, str]:
    found: dict[str, str] = {}
    for key, value in properties:
        if key == PROPERTY and isinstance(value, dict):
            found.update({str(k): str(v) for k, v in value.items()})
    return found


class UnverifiedSummary:
    """Collects each test's unverified fields from its reports; prints the summary."""

    def __init__(self) -> None:
        self.per_test: dict[str, dict[str, str]] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        fields = _fields_of(report.user_properties)
        if fields:
            self.per_test.setdefault(report.nodeid, {}).update(fields)

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        lines = summary_lines(self.per_test)
        if not lines:
            return
        terminalreporter.section(
            f"planned fields the build under test cannot show, left unchecked in "
            f"{len(self.per_test)} tests (each test's Allure result has the detail)")
        for line in lines:
            terminalreporter.write_line(line)


def record_on(node: pytest.Item) -> RecordUnverified:
    """A recorder that adds the fields to ``node``'s user properties."""
    def record(fields: Mapping[str, str]) -> None:
        if fields:
            node.user_properties.append((PROPERTY, dict(fields)))
    return record
