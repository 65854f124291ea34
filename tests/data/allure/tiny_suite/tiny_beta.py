"""The second suite of the tiny run the report tests render (copied as test_beta.py)."""

from __future__ import annotations

import pytest


def test_three() -> None:
    assert True


def test_skipped() -> None:
    pytest.skip("no GPU here")
