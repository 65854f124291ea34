"""The first suite of the tiny run the report tests render (copied as test_alpha.py).

With ``TINY_SECOND_RUN=1`` one more test fails, so two runs make a trend.
"""

from __future__ import annotations

import os

SECOND_RUN = os.environ.get("TINY_SECOND_RUN") == "1"


def test_one() -> None:
    assert True


def test_two() -> None:
    assert not SECOND_RUN, "fails on the second run"


def test_plan_mismatch() -> None:
    # The wording of suites/test_plan_forwarding.py, so the report files it by category.
    problems = ["ctx_size: planned 1024, observed 512"]
    assert not problems, "the server does not report the plan:\n" + "\n".join(problems)
