"""Query strings and path parts of the service's requests, read through one validated parser.

Everything here is pure: a handler names what it reads (``Text``, ``Count``, ``Ratio``)
and gets the value or a :class:`BadRequest` whose message names the parameter, what
was expected and what came. Nothing unvalidated reaches the store or the file system,
so a strange query string is a 400, never a 500 from deep inside a driver.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Longest value of any text parameter (a branch, a hardware identity, a node id).
MAX_TEXT = 1024
#: How much of a refused value an error message quotes.
SHOWN_CHARS = 80

#: ASCII digits only: str.isdigit() is true for "²" and "٣", which int() then refuses
#: or reads as another number.
_WHOLE = re.compile(r"[0-9]{1,12}")
#: A plain decimal number (no "inf", "nan", no hex, no underscores).
_DECIMAL = re.compile(r"[0-9]{1,12}(\.[0-9]{1,12})?|\.[0-9]{1,12}")
#: NUL and the other C0 controls and DEL: no store column or file name should hold them
#: (PostgreSQL refuses NUL in text outright, which would surface as a store failure).
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: Longest relative path inside a report, and of one of its parts (ext4's NAME_MAX).
MAX_REPORT_PATH = 1024
MAX_PATH_PART = 255


class BadRequest(Exception):
    """A request parameter that is refused; ``str()`` is the message for the client."""


def shown(value: str, limit: int = SHOWN_CHARS) -> str:
    """``value`` quoted for a message, cut to ``limit`` characters."""
    cut = value if len(value) <= limit else value[:limit] + "…"
    return repr(cut)


@dataclass(frozen=True)
class Text:
    """A free-text parameter: at most ``MAX_TEXT`` characters, no control characters."""

    name: str
    required: bool = False

    def read(self, params: Mapping[str, str]) -> str | None:
        raw = params.get(self.name)
        if raw is None or raw == "":
            if self.required:
                raise BadRequest(f"the parameter {self.name} is missing")
            return None
        if len(raw) > MAX_TEXT:
            raise BadRequest(f"{self.name} is {len(raw)} characters long; at most "
                             f"{MAX_TEXT} are accepted")
        if _CONTROL.search(raw):
            raise BadRequest(f"{self.name} {shown(raw)} holds a control character (NUL, "
                             "newline, …); send the value without it")
        return raw


@dataclass(frozen=True)
class Count:
    """A whole number from ``low`` to ``high``, written in ASCII digits."""

    name: str
    default: int
    low: int
    high: int

    def read(self, params: Mapping[str, str]) -> int:
        raw = params.get(self.name)
        if raw is None:
            return self.default
        if not _WHOLE.fullmatch(raw) or not self.low <= int(raw) <= self.high:
            raise BadRequest(f"{self.name} {shown(raw)} must be a whole number from "
                             f"{self.low} to {self.high}")
        return int(raw)


@dataclass(frozen=True)
class Ratio:
    """A finite decimal number from ``low`` to ``high`` (no inf, nan or exponent)."""

    name: str
    default: float
    low: float
    high: float

    def read(self, params: Mapping[str, str]) -> float:
        raw = params.get(self.name)
        if raw is None:
            return self.default
        value = float(raw) if _DECIMAL.fullmatch(raw) else math.nan
        # nan fails every comparison, so an unreadable value is refused here too.
        if not self.low <= value <= self.high:
            raise BadRequest(f"{self.name} {shown(raw)} must be a decimal number from "
                             f"{self.low:g} to {self.high:g}")
        return value


@dataclass(frozen=True)
class Choice:
    """One of a closed set of words."""

    name: str
    default: str
    allowed: tuple[str, ...]

    def read(self, params: Mapping[str, str]) -> str:
        raw = params.get(self.name, self.default)
        if raw not in self.allowed:
            raise BadRequest(f"{self.name} {shown(raw)} must be one of "
                             f"{', '.join(self.allowed)}")
        return raw


def report_path(rel: str) -> str:
    """A path inside a run's report, checked before it is joined to anything.

    ``..`` and links are still settled by resolving against the report folder; this
    only refuses what the file system would fail on (NUL, over-long names) or what no
    report file is named (control characters, backslashes).
    """
    if len(rel) > MAX_REPORT_PATH:
        raise BadRequest(f"the report path is {len(rel)} characters long; no report file "
                         f"has a path over {MAX_REPORT_PATH}")
    if _CONTROL.search(rel) or "\\" in rel:
        raise BadRequest(f"the report path {shown(rel)} holds a control character or a "
                         "backslash; no report file is named so")
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_PATH_PART
           for part in rel.split("/")):
        raise BadRequest(f"a part of the report path {shown(rel)} is longer than "
                         f"{MAX_PATH_PART} bytes; no report file is named so")
    return rel
