"""The bisect's journal: every probe on disk as it is judged, so an interrupted bisect
(Ctrl-C, a reboot, a spent budget) continues where it stopped.

One JSON object a line. The first says which bisect this is (tree, endpoints, oracle,
build options, ``--first-parent``); each later one is a probe. A resumed bisect must
be the same one — a journal of another is refused, never mixed in. The file is read
through :func:`read_journal` only, which checks every field: it is a file a person can
edit or truncate, and a torn last line (a kill mid-write) is dropped, not fatal.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from harness.bisect.search import Verdict
from harness.errors import ConfigError
from harness.facts.commit_ids import short_commit

#: A journal larger than this is not one the harness wrote (a probe is a few hundred
#: bytes; a bisect over a million commits is ~20 probes).
MAX_JOURNAL_BYTES = 16 * 1024 * 1024
#: harness/results/run_schema.py's commit id pattern, in Python's words.
_COMMIT_ID = re.compile(r"[0-9a-f]{40}|release:[0-9]{1,9}")


@dataclass(frozen=True)
class Header:
    tree: str
    good: str
    bad: str
    oracle: str
    build: str
    first_parent: bool


@dataclass(frozen=True)
class Probe:
    commit: str
    subject: str
    verdict: Verdict
    evidence: str
    #: The build's key in the cache; empty when the build failed.
    build_key: str
    build_s: float
    judge_s: float
    #: The build came from the cache (the gate, the nightly or an earlier bisect made it).
    cache_hit: bool
    #: A measured probe (--metric): its ratio to the good build with the interval's
    #: ends (ratio, low, high); None for the other oracles.
    ratio: tuple[float, float, float] | None = None

    def to_json(self) -> dict[str, Any]:
        body = {**asdict(self), "verdict": self.verdict.value}
        del body["ratio"]
        if self.ratio is not None:
            body["ratio"], body["ci_low"], body["ci_high"] = self.ratio
        return body


def _check_sha(value: object, where: str) -> str:
    """A git commit id (40 hex digits) or a published release (``release:<N>``)."""
    if not isinstance(value, str) or not _COMMIT_ID.fullmatch(value):
        raise ValueError(f"{where} is not a 40-digit commit id or release:<number>")
    return value


def _field(row: Mapping[str, Any], name: str, kind: type) -> Any:
    value = row.get(name)
    # bool is an int: a count given as true is refused, and a flag must be a bool.
    if not isinstance(value, kind) or (kind in (int, float) and isinstance(value, bool)):
        raise ValueError(f"{name} is not a {kind.__name__}")
    return value


def _header(row: Mapping[str, Any]) -> Header:
    return Header(tree=_field(row, "tree", str), good=_check_sha(row.get("good"), "good"),
                  bad=_check_sha(row.get("bad"), "bad"), oracle=_field(row, "oracle", str),
                  build=_field(row, "build", str),
                  first_parent=_field(row, "first_parent", bool))


def _number(row: Mapping[str, Any], name: str) -> float:
    value = row.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1e9:
        raise ValueError(f"{name} is not a number of seconds")
    return float(value)


def _probe(row: Mapping[str, Any]) -> Probe:
    try:
        verdict = Verdict(row.get("verdict"))
    except ValueError:
        raise ValueError("verdict is not good, bad, skip or undecided") from None
    return Probe(commit=_check_sha(row.get("commit"), "commit"),
                 subject=_field(row, "subject", str), verdict=verdict,
                 evidence=_field(row, "evidence", str), build_key=_field(row, "build_key", str),
                 build_s=_number(row, "build_s"), judge_s=_number(row, "judge_s"),
                 cache_hit=_field(row, "cache_hit", bool), ratio=_ratio(row))


def _ratio(row: Mapping[str, Any]) -> tuple[float, float, float] | None:
    if "ratio" not in row:
        return None
    values = tuple(row.get(name) for name in ("ratio", "ci_low", "ci_high"))
    if not all(isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1e6
               for v in values):
        raise ValueError("ratio, ci_low and ci_high are not three positive numbers")
    low, high = float(values[1]), float(values[2])  # type: ignore[arg-type]
    return float(values[0]), low, high  # type: ignore[arg-type]


def read_journal(path: Path) -> tuple[Header, list[Probe]] | None:
    """The journal at ``path``, or None when there is none (or it is empty)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return None
    if size > MAX_JOURNAL_BYTES:
        raise ConfigError(f"{path} is {size} bytes: not a bisect journal the harness wrote; "
                          "give another --log")
    lines = path.read_bytes().split(b"\n")
    # A kill in the middle of a write leaves a last line without its newline.
    complete = lines[:-1]
    if not complete:
        return None
    rows = []
    for number, raw in enumerate(complete, start=1):
        try:
            row = json.loads(raw)
            if not isinstance(row, dict):
                raise ValueError("not a JSON object")
            rows.append(_header(row) if number == 1 else _probe(row))
        except (ValueError, RecursionError) as exc:
            raise ConfigError(f"{path} line {number} is not a bisect journal line ({exc}); "
                              "it was not written by harness bisect or was edited: give "
                              "another --log, or remove the file to start over") from None
    header, probes = rows[0], rows[1:]
    assert isinstance(header, Header)
    return header, [p for p in probes if isinstance(p, Probe)]


class Journal:
    """Appends probes to the file, each flushed to disk before the next probe starts."""

    def __init__(self, path: Path, header: Header) -> None:
        self.path = path
        found = read_journal(path)
        self.probes: list[Probe] = []
        if found is not None:
            old, self.probes = found
            if old != header:
                raise ConfigError(
                    f"{path} is the journal of another bisect ({_describe(old)}), not of "
                    f"this one ({_describe(header)}): give another --log, or remove it "
                    "to start over")
            _drop_torn_tail(path)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(asdict(header), sort_keys=True) + "\n")

    def add(self, probe: Probe) -> None:
        with self.path.open("a", encoding="utf-8") as out:
            out.write(json.dumps(probe.to_json(), sort_keys=True) + "\n")
            out.flush()
            os.fsync(out.fileno())
        self.probes.append(probe)


def _describe(header: Header) -> str:
    return (f"good {short_commit(header.good)}, bad {short_commit(header.bad)}, {header.oracle}"
            f"{', first parent' if header.first_parent else ''}, build {header.build}")


def _drop_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        path.write_bytes(data[: data.rfind(b"\n") + 1])
