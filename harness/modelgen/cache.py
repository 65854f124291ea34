"""Writing a fixture root and keeping a cached one correct.

``write_tree`` writes every file fresh. ``ensure_tree`` is the cache path: under a file
lock (so concurrent pytest-xdist workers write once), it keeps each file whose sha256
matches the record and rewrites any that is missing or altered.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from harness.bounded import bounded_lock
from harness.errors import FixtureError
from harness.files import atomic_write, sha256_file
from harness.modelgen.fixture_tree import PlannedFile

#: Writing every fixture takes well under a second; a lock held this long is stuck.
LOCK_TIMEOUT_S = 300.0
LOCK_NAME = ".lock"

_REGENERATE = (
    "if a spec or the writer changed on purpose, regenerate the record with "
    "`harness fixtures --record` and commit fixtures/models/sha256.json"
)


def _write(root: Path, planned: PlannedFile) -> str:
    dest = root / planned.rel
    atomic_write(dest, lambda tmp: planned.write(root, tmp))
    return sha256_file(dest)


def write_tree(root: Path, files: list[PlannedFile]) -> dict[str, str]:
    return {f.rel: _write(root, f) for f in files}


def _check_record(files: list[PlannedFile], recorded: Mapping[str, str]) -> None:
    planned = {f.rel for f in files}
    missing = sorted(planned - set(recorded))
    stale = sorted(set(recorded) - planned)
    if missing or stale:
        raise FixtureError(
            "fixtures/models/sha256.json does not match the specs "
            f"(not recorded: {', '.join(missing) or 'none'}; "
            f"recorded but no longer written: {', '.join(stale) or 'none'}); {_REGENERATE}"
        )


def ensure_tree(root: Path, files: list[PlannedFile], recorded: Mapping[str, str]) -> None:
    _check_record(files, recorded)
    root.mkdir(parents=True, exist_ok=True)
    with bounded_lock(root / LOCK_NAME, wait_s=LOCK_TIMEOUT_S, purpose="writing fixtures",
                      error=FixtureError, setting="harness.modelgen.cache.LOCK_TIMEOUT_S"):
        for planned in files:
            dest, expected = root / planned.rel, recorded[planned.rel]
            if dest.is_file() and sha256_file(dest) == expected:
                continue
            got = _write(root, planned)
            if got != expected:
                raise FixtureError(
                    f"{dest}: the writer produced sha256 {got}, but sha256.json records "
                    f"{expected}; {_REGENERATE}"
                )
