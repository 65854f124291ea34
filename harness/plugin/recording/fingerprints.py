"""The numerics fingerprints a run record keeps: one per numerics probe, by test id.

A numerics test hands its probe's fingerprint (``harness.numerics.fingerprint``: greedy
tokens and top log-probabilities) to the ``record_fingerprint`` fixture, which adds it
to the test's user properties. Reports carry user properties from xdist workers to the
controller, which collects them here and writes them into ``run.json``'s ``numerics``
(test id -> fingerprint), where ``harness compare`` holds a later run's to them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import pytest

from harness.numerics.fingerprint import Fingerprint

#: The user-property name a test's fingerprint travels under.
PROPERTY = "harness_numerics_fingerprint"

#: What the fixture hands a test: record this probe's fingerprint.
RecordFingerprint = Callable[[Fingerprint], None]


def fingerprint_recorder(node: pytest.Item) -> RecordFingerprint:
    def record(fingerprint: Fingerprint) -> None:
        node.user_properties.append((PROPERTY, fingerprint.as_json()))
    return record


def fingerprint_of_properties(properties: Iterable[tuple[str, object]]
                              ) -> dict[str, Any] | None:
    """The last fingerprint among a report's user properties (its JSON form), or None."""
    found = None
    for key, value in properties:
        if key == PROPERTY and isinstance(value, dict):
            found = value
    return found
