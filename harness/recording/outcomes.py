"""Turns pytest's per-phase reports into one outcome per test (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.model import TestOutcome


@dataclass
class _Tally:
    outcome: str = "passed"
    duration_s: float = 0.0
    message: str | None = None


class OutcomeTally:
    """Feed it every report (setup, call, teardown); read ``outcomes()`` at the end."""

    def __init__(self) -> None:
        self._tests: dict[str, _Tally] = {}

    def add(self, nodeid: str, when: str, outcome: str, duration_s: float,
            *, message: str | None = None, wasxfail: bool = False) -> None:
        tally = self._tests.setdefault(nodeid, _Tally())
        tally.duration_s += duration_s
        if when == "call":
            if wasxfail:
                tally.outcome = "xfailed" if outcome == "skipped" else "xpassed"
            elif outcome != "passed":
                tally.outcome = outcome
        elif outcome == "failed":
            # A failing fixture is an error in the test's set-up or tear-down, as pytest says.
            if tally.outcome in ("passed", "xpassed"):
                tally.outcome = "error"
        elif outcome == "skipped" and when == "setup":
            # xfail(run=False) and pytest.xfail() in a fixture end in set-up, as pytest
            # counts them: xfailed, not skipped.
            tally.outcome = "xfailed" if wasxfail else "skipped"
        if outcome in ("failed", "skipped") and message and tally.message is None:
            tally.message = message

    def outcomes(self) -> list[TestOutcome]:
        return [TestOutcome(test_id=nodeid, outcome=t.outcome, duration_s=round(t.duration_s, 3),
                            message=t.message)
                for nodeid, t in self._tests.items()]
