"""The outcome of holding one planned field against a ``LaunchReport`` (pure).

``plan_check.compare_launch`` checks each planned field with a *comparer*: a function of
the planned value and the report that returns a ``FieldCheck``. The comparers live in
``plan_check`` (context, batches, speculation) and ``placement_checks`` (where the weights
and the KV cache went); this module is the shape they share, kept apart so that neither
imports the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from harness.verdicts.launch_report import LaunchReport


@dataclass(frozen=True)
class FieldCheck:
    """What a planned value comes to on the server, what the log shows, and why they differ."""

    expected: object
    observed: object
    detail: str = ""
    #: Set when the check is not plain equality of ``expected`` and ``observed``.
    ok: bool | None = None

    @property
    def matches(self) -> bool:
        return self.expected == self.observed if self.ok is None else self.ok


Comparer = Callable[[object, LaunchReport], FieldCheck]


def int_field(value: object, key: str) -> int:
    """``value`` as the int ``key`` must be (a bool is refused), else TypeError."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"compare_launch: {key} must be an int, got {value!r}")
    return value
