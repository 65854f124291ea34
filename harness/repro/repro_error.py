"""The one error ``harness repro`` raises for a failure it cannot reproduce as recorded."""

from __future__ import annotations

from harness.errors import HarnessError


class ReproError(HarnessError):
    """A failure cannot be reproduced as recorded; the message says what is missing."""
