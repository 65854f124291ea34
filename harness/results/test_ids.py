"""Test ids across the move of the suites: old records keep their history.

Until 2026-12 the suites were the package folder ``harness/suites/``, so stored outcomes,
run records and known-flakes lists name them ``harness/suites/test_x.py::…``; the design
card puts them at the top again, ``suites/test_x.py::…``. Every reader maps the old form
to the new one (store rows, parsed run records, known-flakes entries, ``harness repro``),
so a baseline from before the move compares test by test with a run after it.
"""

from __future__ import annotations

#: How a suite test's node id begins now, and how it began before the move.
SUITES_PREFIX = "suites/"
LEGACY_SUITES_PREFIX = "harness/suites/"


def current_test_id(test_id: str) -> str:
    """``test_id`` as the suites are laid out now (other ids unchanged)."""
    if test_id.startswith(LEGACY_SUITES_PREFIX):
        return SUITES_PREFIX + test_id.removeprefix(LEGACY_SUITES_PREFIX)
    return test_id
