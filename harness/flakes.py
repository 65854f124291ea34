"""Known flakes as reviewed data: ``ci/known-flakes.yaml``, loaded, checked and matched.

Each entry names a test (a pytest node id, or a glob over node ids), the hardware it
flakes on (a glob over the run's hardware description or GPU name, or ``any``), why,
where it is tracked, and when the entry expires. An entry is a promise to fix the test
by that date: after it, the entry fails every run until someone fixes the test or, after
a review, renews the date. Loading is strict: every problem names the file, the entry
number and the field.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.errors import ConfigError
from harness.results.model import Hardware

FIELDS = ("test", "hardware", "reason", "tracking", "expires")
ANY_HARDWARE = "any"


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
    if not isinstance(data, dict) or set(data) != {"flakes"}:
        raise KnownFlakesError(f"{source}: the file must be a mapping with one key, 'flakes' "
                               "(a list of entries; `flakes: []` for none)")
    raw = data["flakes"]
    if raw is None:
        raw = []
    if not isinstance(raw, list):
        raise KnownFlakesError(f"{source}: 'flakes' must be a list of entries, not "
                               f"{type(raw).__name__}")
    return KnownFlakes(source, tuple(_entry(source, number, item)
                                     for number, item in enumerate(raw, 1)))


def load_known_flakes(path: Path) -> KnownFlakes:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise KnownFlakesError(f"cannot read the known-flakes file {path}: "
                               f"{exc.strerror or exc}; pass an existing file to "
                               "--harness-known-flakes, or `none`") from exc
    return parse_known_flakes(text, str(path))


def _entry(source: str, number: int, item: Any) -> KnownFlake:
    where = f"{source}: entry {number}"
    if not isinstance(item, dict):
        raise KnownFlakesError(f"{where}: must be a mapping with the fields "
                               f"{', '.join(FIELDS)}")
    unknown = sorted(str(k) for k in item if k not in FIELDS)
    if unknown:
        raise KnownFlakesError(f"{where}: unknown field(s) {', '.join(unknown)}; the fields "
                               f"are {', '.join(FIELDS)}")
    missing = [f for f in FIELDS if f not in item]
    if missing:
        raise KnownFlakesError(f"{where}: field {missing[0]!r} is missing; every entry has "
                               f"{', '.join(FIELDS)}")
    texts = {}
    for name in ("test", "hardware", "reason", "tracking"):
        value = item[name]
        if not isinstance(value, str) or not value.strip():
            raise KnownFlakesError(f"{where}: field {name!r} must be a non-empty string, not "
                                   f"{value!r}")
        texts[name] = value.strip()
    if not texts["tracking"].startswith(("http://", "https://")):
        raise KnownFlakesError(f"{where}: field 'tracking' must be a link to the issue that "
                               f"tracks the flake (http(s)://...), not {texts['tracking']!r}")
    return KnownFlake(number=number, expires=_date(where, item["expires"]), **texts)


def _date(where: str, value: Any) -> dt.date:
    # YAML reads an unquoted 2027-01-31 as a date already; a quoted one is a string.
    if isinstance(value, dt.date) and not isinstance(value, dt.datetime):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}", value.strip()):
        try:
            return dt.date.fromisoformat(value.strip())
        except ValueError:
            pass
    raise KnownFlakesError(f"{where}: field 'expires' must be a date YYYY-MM-DD, not "
                           f"{value!r}")
