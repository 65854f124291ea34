"""Crashed starts, counted per build and model in the harness cache, and the quarantine.

A runtime that starts llama-server for its users (reference 002, docs/references.md)
remembers each start that crashed, forgets them at the first good start, and stops
starting a build that crashed ``QUARANTINE_STRIKES`` (three) times in a row: by then
another start costs a user more than it tells. The harness keeps the same book, one JSON
file per build and model under ``$HARNESS_CACHE/strikes/``, so the strikes outlive the
pytest process and are shared by its xdist workers (a file lock around each change). What
counts is a start that died of a signal (``crash``) or of an instruction the CPU lacks
(``cannot-run-here``); an out-of-memory start, a refused flag or a broken drafter is
answered otherwise (the ladder, a harness bug, the drafter left out) and is no strike.

Lifting a quarantine is deleting the file the verdict names (or the whole folder).
"""

from __future__ import annotations

import hashlib
import json
from contextlib import AbstractContextManager
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from harness.bounded import bounded_lock
from harness.errors import HarnessError, ServerError
from harness.files import write_json_atomic
from harness.paths import cache_root
from harness.verdicts.failure import FailureClass, StartFailure

#: Crashed starts in a row after which a build is not started again for that model.
QUARANTINE_STRIKES = 3
#: The failures that are the build's own crash.
STRIKING = frozenset({FailureClass.CRASH, FailureClass.CANNOT_RUN_HERE})
#: Log lines kept with a strike (the last ones: what the process said before it died).
LOG_TAIL_LINES = 6
#: Seconds a change to one book may wait for another process's change to finish.
LOCK_WAIT_S = 60.0


class QuarantinedError(ServerError):
    """The build crashed ``QUARANTINE_STRIKES`` starts in a row with this model; no start
    was made. The message is the verdict: each crash and how to lift it."""


@dataclass(frozen=True)
class Strike:
    kind: str
    exit_code: int | None
    evidence: str
    log_tail: tuple[str, ...]
    at: str

    def describe(self) -> str:
        status = "no exit status" if self.exit_code is None else (
            f"killed by signal {-self.exit_code}" if self.exit_code < 0
            else f"exit status {self.exit_code}")
        return f"{self.at} {self.kind} ({status}): {self.evidence}"


def quarantine_verdict(build_key: str, model: Path, strikes: tuple[Strike, ...],
                       book: Path) -> str:
    """The words of a quarantine (pure): each crash, then how to lift it."""
    lines = [f"quarantined: build {build_key} crashed {len(strikes)} starts in a row with "
             f"{model} (the harness stops at {QUARANTINE_STRIKES}); no start was made"]
    for number, strike in enumerate(strikes, 1):
        lines.append(f"  crash {number}: {strike.describe()}")
        lines += [f"    | {line}" for line in strike.log_tail]
    lines.append(f"lift it by deleting {book} (every quarantine: {book.parent.parent}), "
                 "after fixing the build or the host; a good start of the build with this "
                 "model clears it too")
    return "\n".join(lines)


def strike_words(build_key: str, strikes: tuple[Strike, ...], book: Path) -> str:
    """What the latest of ``strikes`` means for the build (pure): its count, or the
    quarantine it starts."""
    if len(strikes) >= QUARANTINE_STRIKES:
        return (f"strike {len(strikes)} against build {build_key} with this model: "
                f"quarantined, it is not started with it again until {book} is deleted")
    return (f"strike {len(strikes)} of {QUARANTINE_STRIKES} against build {build_key} with "
            f"this model ({book})")


def cache_book() -> StrikeBook:
    """The harness cache's book, which the supervisor and the plugin's starts share."""
    return StrikeBook(cache_root() / "strikes")


class StrikeBook:
    """The crashed starts of each (build, model), under ``root`` (``$HARNESS_CACHE/strikes``)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, build_key: str, model: Path) -> Path:
        digest = hashlib.sha256(str(model.resolve()).encode()).hexdigest()[:16]
        return self.root / build_key / f"{model.name}-{digest}.json"

    def strikes(self, build_key: str, model: Path) -> tuple[Strike, ...]:
        path = self.path(build_key, model)
        try:
            body = json.loads(path.read_text(encoding="utf-8"))
            return tuple(Strike(kind=str(s["kind"]), exit_code=s["exit_code"],
                                evidence=str(s["evidence"]),
                                log_tail=tuple(map(str, s["log_tail"])), at=str(s["at"]))
                         for s in body["strikes"])
        except FileNotFoundError:
            return ()
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise HarnessError(f"the strike book {path} cannot be read ({exc}); delete it "
                               "to start counting again") from None

    def quarantine(self, build_key: str, model: Path) -> str | None:
        """The verdict when this build is quarantined for ``model``, else None."""
        strikes = self.strikes(build_key, model)
        if len(strikes) < QUARANTINE_STRIKES:
            return None
        return quarantine_verdict(build_key, model, strikes, self.path(build_key, model))

    def record(self, build_key: str, model: Path, failure: StartFailure,
               log_text: str) -> tuple[Strike, ...]:
        """Add ``failure`` (one of ``STRIKING``) to the book; every strike so far."""
        tail = tuple(line for line in log_text.splitlines() if line.strip())[-LOG_TAIL_LINES:]
        strike = Strike(failure.kind.value, failure.exit_code, failure.evidence, tail,
                        datetime.now(UTC).isoformat(timespec="seconds"))
        path = self.path(build_key, model)
        with self._lock(path):
            strikes = (*self.strikes(build_key, model), strike)
            write_json_atomic(path, {"build_key": build_key, "model": str(model),
                                     "strikes": [asdict(s) for s in strikes]})
        return strikes

    def clear(self, build_key: str, model: Path) -> None:
        path = self.path(build_key, model)
        if not path.exists():
            return
        with self._lock(path):
            path.unlink(missing_ok=True)

    def _lock(self, path: Path) -> AbstractContextManager[None]:
        path.parent.mkdir(parents=True, exist_ok=True)
        return bounded_lock(path.with_suffix(".lock"), wait_s=LOCK_WAIT_S,
                            purpose="recording a crashed start", error=HarnessError,
                            setting="harness.supervise.strikes.LOCK_WAIT_S")
