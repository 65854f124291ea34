"""One row of the release matrix from a release's run record, and the table (pure).

Every test of a release lands in exactly one column:

- ``passed``;
- ``unsupported``: skipped because the build lacks a feature the test needs (the
  skip reason starts ``not supported by this build``);
- ``skipped``: any other skip (no GPU on this runner, a fixture left out);
- ``difference``: failed where the pin passed (the pin's run is the other side), or
  with a finding that names both sides itself — a behaviour of this release that differs
  from the pin's, or a release the harness does not model;
- ``harness error``: an error in a test's set-up or tear-down, a test that hit
  pytest's own timeout, or a failure the harness names as its own bug. A matrix is
  healthy when this column is zero everywhere;
- ``failed``: any other failure — a regression of this release, for a person to read.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, field

from harness.results.run_record import Outcome, RunRecord, TestOutcome

#: How a skip for a feature the build lacks begins (harness/planning/ writes it).
UNSUPPORTED_PREFIX = "not supported by this build"
#: Words a failure uses when it reports a release's difference with both sides.
DIFFERENCE_MARKERS = ("differs from the pin", "not modelled for release")
#: Words of a failure that is the harness's fault, not the build's.
OWN_FAULT_MARKERS = ("harness bug", "Timeout >")


class Column(enum.StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    UNSUPPORTED = "unsupported"
    SKIPPED = "skipped"
    DIFFERENCE = "differences"
    ERROR = "harness errors"


def column_of(outcome: TestOutcome, on_the_pin: TestOutcome | None = None) -> Column:
    """The column one test's outcome counts in (see the module docstring); ``on_the_pin``
    is the same test's outcome in the pin's run, when there is one."""
    message = outcome.message or ""
    if outcome.outcome in (Outcome.PASSED, Outcome.XPASSED):
        return Column.PASSED
    if outcome.outcome is Outcome.ERROR:
        return Column.ERROR
    if outcome.outcome is Outcome.SKIPPED:
        return Column.UNSUPPORTED if UNSUPPORTED_PREFIX in message else Column.SKIPPED
    if outcome.outcome is Outcome.XFAILED:
        # A known flake (harness/plugin/recording/flakes_plugin.py) is not a finding.
        return Column.SKIPPED
    if any(marker in message for marker in OWN_FAULT_MARKERS):
        return Column.ERROR
    if any(marker in message for marker in DIFFERENCE_MARKERS):
        return Column.DIFFERENCE
    if on_the_pin is not None and on_the_pin.outcome is Outcome.PASSED:
        return Column.DIFFERENCE
    return Column.FAILED


@dataclass(frozen=True)
class ReleaseRow:
    """What one release gave: counts per column, or why there are none."""

    release: int
    #: Whether this is the release the harness pins (its own reference).
    pinned: bool = False
    counts: dict[Column, int] = field(default_factory=dict)
    #: Why the suites gave no record (a build that failed, a fetch that failed, a run
    #: that hung past its bound): one line; None when they ran.
    problem: str | None = None
    #: Where the release's run record and report are.
    record: str | None = None
    seconds: float = 0.0

    @property
    def harness_errors(self) -> int:
        """Harness errors, counting a run that never produced a record as one."""
        return self.counts.get(Column.ERROR, 0) + (1 if self.hung else 0)

    @property
    def hung(self) -> bool:
        return self.problem is not None and self.problem.startswith(HUNG)

    def to_json(self) -> dict[str, object]:
        return {"release": self.release, "pinned": self.pinned,
                **{column.value: self.counts.get(column, 0) for column in Column},
                "problem": self.problem, "record": self.record,
                "seconds": round(self.seconds, 1)}


#: How a row's problem begins when the suites outlived the matrix's bound.
HUNG = "hung"


def row_from_record(release: int, record: RunRecord, *, pinned: bool = False,
                    seconds: float = 0.0, where: str | None = None,
                    pin: RunRecord | None = None) -> ReleaseRow:
    """The release's row; ``pin``: the pin's run, which makes a failure of a test the
    pin passed a difference."""
    on_the_pin = _by_test(pin)
    counts = dict.fromkeys(Column, 0)
    for outcome in record.outcomes:
        counts[column_of(outcome, on_the_pin.get(outcome.test_id))] += 1
    return ReleaseRow(release=release, pinned=pinned, counts=counts, record=where,
                      seconds=seconds)


def _by_test(record: RunRecord | None) -> dict[str, TestOutcome]:
    return {} if record is None else {o.test_id: o for o in record.outcomes}


#: Symptoms of older releases seen through the suites, in the server's words, and what
#: lies behind each (read from that release's source and its server log).
KNOWN_SYMPTOMS = {
    "does not match the expected Content-only format": (
        "the release's chat parser refuses generated text that is not valid UTF-8 "
        "(its log: 'common_chat_peg_parse: unparsed Content-only output') and /completion "
        "answers HTTP 500; the pin returns the same text with U+FFFD in place of the bytes "
        "(seen on b10502 with the byte-vocabulary fixtures)"),
    "This GGUF does not support multimodal": (
        "the release's glm4moe graph has no MTP path, so a draft-mtp start aborts (SIGABRT) "
        "in the graph builder; glm4moe runs its MTP block from b10603"),
}


@dataclass(frozen=True)
class Finding:
    """One test a person should read: its column, this release's side and the pin's."""

    column: Column
    test_id: str
    release_side: str
    pin_side: str
    #: What lies behind the release's side, where the symptom is a known one.
    explained: str | None = None


def findings(record: RunRecord, pin: RunRecord | None = None) -> list[Finding]:
    """The outcomes a person should read (differences, harness errors, failures), with
    both sides where the pin ran, in the record's order."""
    wanted = (Column.DIFFERENCE, Column.ERROR, Column.FAILED)
    on_the_pin = _by_test(pin)
    found = []
    for outcome in record.outcomes:
        other = on_the_pin.get(outcome.test_id)
        column = column_of(outcome, other)
        if column in wanted:
            found.append(Finding(column, outcome.test_id, _side(outcome),
                                 _side(other) if other else "not run on the pin",
                                 explain(outcome.message or "")))
    return found


def explain(message: str) -> str | None:
    """What lies behind a known symptom in ``message``; None for any other."""
    return next((why for symptom, why in KNOWN_SYMPTOMS.items() if symptom in message), None)


def _side(outcome: TestOutcome) -> str:
    # The last line of a failure's message is the exception pytest reports.
    lines = (outcome.message or "").strip().splitlines()
    said = f": {lines[-1][:400]}" if lines else ""
    return f"{outcome.outcome.value} in {outcome.duration_s:.1f} s{said}"


def render_findings(release: int, found: Sequence[Finding]) -> str:
    """A release's findings as Markdown: one section a test, the release's side and the
    pin's."""
    lines = [f"# b{release}: {len(found)} finding(s)", ""]
    for item in found:
        lines += [f"## {item.column.value}: `{item.test_id}`", "",
                  f"- b{release}: {item.release_side}", f"- pin: {item.pin_side}"]
        if item.explained:
            lines.append(f"- why: {item.explained}")
        lines.append("")
    return "\n".join(lines)


_HEADER = ("release", *(column.value for column in Column), "minutes", "note")


def render_table(rows: Sequence[ReleaseRow]) -> str:
    """The matrix as a Markdown table, oldest release first: one row a release."""
    lines = ["| " + " | ".join(_HEADER) + " |", "|" + " --- |" * len(_HEADER)]
    for row in sorted(rows, key=lambda r: r.release):
        name = f"b{row.release}" + (" (pin)" if row.pinned else "")
        cells = [str(row.counts.get(column, 0)) for column in Column]
        if row.hung:
            cells[list(Column).index(Column.ERROR)] = str(row.harness_errors)
        note = row.problem or ""
        lines.append("| " + " | ".join([name, *cells, f"{row.seconds / 60:.1f}",
                                        note.replace("|", "/")]) + " |")
    return "\n".join(lines)
