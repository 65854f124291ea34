"""Turns pytest's per-phase reports into one outcome per test (pure).

pytest reports each phase (setup, call, teardown) as passed, failed or skipped; the
test's one :class:`~harness.results.run_record.Outcome` is folded from them the way pytest's
terminal summary counts it (a failing fixture is an ``error``, an xfail ``xfailed``).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.results.run_record import Outcome, TestOutcome

#: What ``TestReport.outcome`` says of one phase (pytest's ``Literal`` of three).
PHASE_OUTCOMES = (Outcome.PASSED, Outcome.FAILED, Outcome.SKIPPED)


@dataclass
class _Tally:
    outcome: Outcome = Outcome.PASSED
    duration_s: float = 0.0
    message: str | None = None


def phase_outcome(word: str) -> Outcome:
    """pytest's word for a phase as an Outcome; ValueError for any other word."""
    for outcome in PHASE_OUTCOMES:
        if word == outcome.value:
            return outcome
    raise ValueError(f"pytest reported a phase as {word!r}; expected one of "
                     f"{', '.join(o.value for o in PHASE_OUTCOMES)}")


class OutcomeTally:
    """Feed it every report (setup, call, teardown); read ``outcomes()`` at the end."""

    def __init__(self) -> None:
        self._tests: dict[str, _Tally] = {}

    def add(self, nodeid: str, when: str, outcome: str, duration_s: float,
            *, message: str | None = None, wasxfail: bool = False) -> None:
        # Parsed before anything is counted: an unknown word changes no tally.
        phase = phase_outcome(outcome)
        tally = self._tests.setdefault(nodeid, _Tally())
        tally.duration_s += duration_s
        if when == "call":
            if wasxfail:
                tally.outcome = (Outcome.XFAILED if phase is Outcome.SKIPPED
                                 else Outcome.XPASSED)
            elif phase is not Outcome.PASSED:
                tally.outcome = phase
        elif phase is Outcome.FAILED:
            # A failing fixture is an error in the test's set-up or tear-down, as pytest says.
            if tally.outcome in (Outcome.PASSED, Outcome.XPASSED):
                tally.outcome = Outcome.ERROR
        elif phase is Outcome.SKIPPED and when == "setup":
            # xfail(run=False) and pytest.xfail() in a fixture end in set-up, as pytest
            # counts them: xfailed, not skipped.
            tally.outcome = Outcome.XFAILED if wasxfail else Outcome.SKIPPED
        if phase in (Outcome.FAILED, Outcome.SKIPPED) and message and tally.message is None:
            tally.message = message

    def outcomes(self) -> list[TestOutcome]:
        return [TestOutcome(test_id=nodeid, outcome=t.outcome, duration_s=round(t.duration_s, 3),
                            message=t.message)
                for nodeid, t in self._tests.items()]
