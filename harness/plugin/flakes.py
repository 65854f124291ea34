"""Known flakes as reviewed data: ``resources/known-flakes.yaml``, loaded, checked and matched.

Each entry names a test (a pytest node id, or a glob over node ids), the hardware it
flakes on (a glob over the run's hardware description or GPU name, or ``any``), why,
where it is tracked, and when the entry expires. An entry is a promise to fix the test
by that date: after it, the entry fails every run until someone fixes the test or, after
a review, renews the date. Loading is strict: the YAML is parsed to data and checked
against resources/schemas/known-flakes.schema.json, and every problem names the file, the field's
path (``$.flakes[0].tracking``, entries counted from 0) and what it may be.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.data_schema import check, schema_file
from harness.errors import ConfigError
from harness.results.run_record import Hardware
from harness.results.test_ids import current_test_id

FIELDS = ("test", "hardware", "reason", "tracking", "expires")
ANY_HARDWARE = "any"
#: The file's format; its entries have exactly FIELDS.
SCHEMA = schema_file("known-flakes")
_FIX = "the fields are described at the top of harness/resources/known-flakes.yaml"


def glob_match(text: str, pattern: str) -> bool:
    """``*`` is any run of characters and ``?`` one; everything else is itself.

    Not fnmatch: its ``[...]`` is a character class, and node ids of parametrized tests
    are full of brackets (``test_ladder[moe-4]``) that must match themselves.
    """
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


class KnownFlakesError(ConfigError):
    """The known-flakes file cannot be read or an entry in it is malformed."""


@dataclass(frozen=True)
class KnownFlake:
    #: 1-based position in the file, for messages.
    number: int
    test: str
    hardware: str
    reason: str
    tracking: str
    expires: dt.date

    def matches(self, nodeid: str, hardware: Hardware) -> bool:
        return glob_match(nodeid, self.test) and self.on(hardware)

    def on(self, hardware: Hardware) -> bool:
        """Whether the entry's hardware pattern takes ``hardware`` (case-insensitive)."""
        if self.hardware.strip().lower() == ANY_HARDWARE:
            return True
        pattern = self.hardware.lower()
        return any(glob_match(text.lower(), pattern)
                   for text in (hardware.describe(), hardware.gpu))

    def is_expired(self, today: dt.date) -> bool:
        return today > self.expires

    def describe(self) -> str:
        return f"entry {self.number} ({self.test} on {self.hardware})"

    def outcome_reason(self) -> str:
        """What the test's xfail says: the reason and where it is tracked."""
        return f"known flake: {self.reason} ({self.tracking})"


@dataclass(frozen=True)
class KnownFlakes:
    source: str
    entries: tuple[KnownFlake, ...] = ()

    def match(self, nodeid: str, hardware: Hardware) -> KnownFlake | None:
        """The first entry listing ``nodeid`` on ``hardware``, or None."""
        return next((e for e in self.entries if e.matches(nodeid, hardware)), None)

    def expired(self, today: dt.date) -> tuple[KnownFlake, ...]:
        return tuple(e for e in self.entries if e.is_expired(today))


def parse_known_flakes(text: str, source: str) -> KnownFlakes:
    """The entries of a known-flakes document (pure); KnownFlakesError names what is wrong."""
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise KnownFlakesError(f"{source}: not valid YAML ({exc}); fix the syntax") from exc
    except ValueError as exc:
        # PyYAML builds an unquoted date while parsing: 2027-02-30 fails in there.
        raise KnownFlakesError(f"{source}: a date in it does not exist ({exc}); field "
                               "'expires' must be a date YYYY-MM-DD") from exc
    data = _plain(data)
    check(data, SCHEMA, source, KnownFlakesError, fix=_FIX)
    return KnownFlakes(source, tuple(_entry(number, item)
                                     for number, item in enumerate(data["flakes"] or (), 1)))


def load_known_flakes(path: Path) -> KnownFlakes:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KnownFlakesError(f"cannot read the known-flakes file {path}: "
                               f"{exc.strerror or exc}; pass an existing file to "
                               "--harness-known-flakes, or `none`") from exc
    return parse_known_flakes(text, str(path))


def _plain(value: Any) -> Any:
    """YAML's data as JSON's: dates as YYYY-MM-DD text, mapping keys as text.

    YAML reads an unquoted 2027-01-31 as a date and a quoted one as a string; the schema
    takes both as the string. A date with a time is no date: its text is refused there.
    """
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def _entry(number: int, item: Mapping[str, str]) -> KnownFlake:
    """An entry the schema accepted."""
    # A list written before the suites moved names them harness/suites/…: it still holds.
    return KnownFlake(number=number, test=current_test_id(item["test"].strip()),
                      hardware=item["hardware"].strip(), reason=item["reason"].strip(),
                      tracking=item["tracking"].strip(),
                      expires=dt.date.fromisoformat(item["expires"]))
