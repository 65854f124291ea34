"""What says whether one build is good or bad: a command (``--script``) or suite tests
(``--test``).

An oracle sees the probed build and a folder of its own for what it writes, and answers
a :class:`Judgement`: the verdict and the evidence a person reads in the table.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from harness.bisect.history import Commit
from harness.bisect.search import Verdict
from harness.bounded import run_step
from harness.builds.native import BuildResult
from harness.errors import ConfigError, HarnessError
from harness.facts.commit_ids import short_commit
from harness.paths import SUITES_NODEID_PREFIX, SUITES_ROOTDIR, suites_pytest_config
from harness.plugin.recording.run_file import new_run_id
from harness.results.run_record import Outcome, TestOutcome
from harness.results.run_validation import parse_run_json

#: git bisect run's contract: this exit code means "this commit cannot be judged".
SKIP_EXIT = 125
#: The longest one judgement may take before the bisect stops (a hung oracle is an
#: error, not a verdict: a regression that hangs is the script's to time out).
DEFAULT_JUDGE_LIMIT_S = 1800.0
#: How much of an oracle's output the evidence keeps.
EVIDENCE_LINES = 3
#: Outcomes a named test may have on a good build: passed, or a known flake excused.
_PASSING = frozenset({Outcome.PASSED, Outcome.XPASSED, Outcome.XFAILED})


class JudgeError(HarnessError):
    """An oracle could not give a verdict (it hung, or left nothing to read)."""


@dataclass(frozen=True)
class Judgement:
    verdict: Verdict
    #: One line a person acts on: the failed tests and their messages, a script's last
    #: output lines.
    evidence: str
    seconds: float = 0.0
    #: A measured probe's ratio to the good build and its interval (ratio, low, high).
    ratio: tuple[float, float, float] | None = None


@dataclass(frozen=True)
class ProbeContext:
    """Where a probe stands in the bisect: its output folder, the endpoints, and their
    builds on demand (an oracle that measures against them; cache hits once built)."""

    folder: Path
    good: Commit
    bad: Commit
    build_of: Callable[[Commit], BuildResult]


class Oracle(Protocol):
    def describe(self) -> str:
        """What the oracle is, in one line (kept in the journal: a resumed bisect must
        use the same one)."""
        ...

    def judge(self, build: BuildResult, commit: Commit, context: ProbeContext) -> Judgement: ...


def probe_environment(build: BuildResult, commit: Commit) -> dict[str, str]:
    """What a script learns of the probed build (documented in docs/bisect.md)."""
    return {"HARNESS_BISECT_BINARY": str(build.binary),
            "HARNESS_BISECT_BUILD_JSON": str(build.directory / "build.json"),
            "HARNESS_BISECT_COMMIT": commit.sha,
            "HARNESS_BISECT_SOURCE": build.info.source_origin}


@dataclass(frozen=True)
class ScriptOracle:
    """``--script CMD``: run by ``/bin/sh -c``; exit 0 good, 125 skip, anything else bad."""

    command: str
    limit_s: float = DEFAULT_JUDGE_LIMIT_S

    def describe(self) -> str:
        return f"script: {self.command}"

    def judge(self, build: BuildResult, commit: Commit, context: ProbeContext) -> Judgement:
        context.folder.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        log = context.folder / "script.log"
        with log.open("w", encoding="utf-8") as out:
            ran = run_step(["/bin/sh", "-c", self.command], step=f"the script {self.command!r}",
                           limit_s=self.limit_s, error=JudgeError, log_path=log,
                           setting="harness bisect --judge-limit-s",
                           on_line=lambda line: out.write(line + "\n"),
                           env={**os.environ, **probe_environment(build, commit)})
        verdict = (Verdict.GOOD if ran.code == 0 else
                   Verdict.SKIP if ran.code == SKIP_EXIT else Verdict.BAD)
        said = " | ".join(line.strip() for line in ran.tail[-EVIDENCE_LINES:] if line.strip())
        return Judgement(verdict, f"exit {ran.code}" + (f": {said}" if said else ""),
                         time.monotonic() - started)


def check_test_ids(node_ids: Sequence[str]) -> tuple[str, ...]:
    """``node_ids`` if each names a suite test (``suites/test_x.py::test_y[p]``)."""
    for node_id in node_ids:
        path = node_id.split("::", 1)[0]
        if not node_id.startswith(SUITES_NODEID_PREFIX) or "::" not in node_id \
                or ".." in Path(path).parts or not (SUITES_ROOTDIR / path).is_file():
            raise ConfigError(f"--test {node_id!r} names no suite test: give a node id as "
                              "the run record and `harness run` print them, "
                              "suites/test_<suite>.py::test_<name>[<param>]")
    return tuple(node_ids)


@dataclass(frozen=True)
class TestOracle:
    """``--test NODEID…``: the named suite tests against the probed build.

    Good when every one passes (a known flake, which the suites' plugin turns into an
    xfail, counts as passing); bad when one fails, errors or skips on every try: a
    failing probe runs again ``reruns`` times, so a flake does not steer the search.
    """

    node_ids: tuple[str, ...]
    reruns: int = 1
    limit_s: float = DEFAULT_JUDGE_LIMIT_S

    def describe(self) -> str:
        return "tests: " + " ".join(self.node_ids)

    def judge(self, build: BuildResult, commit: Commit, context: ProbeContext) -> Judgement:
        started = time.monotonic()
        tries: list[tuple[TestOutcome, ...]] = []
        for attempt in range(1 + self.reruns):
            outcomes = self._run(build, commit, context.folder / f"try-{attempt + 1}")
            tries.append(outcomes)
            if not _failing(outcomes):
                break
        return Judgement(*verdict_of_tries(self.node_ids, tries),
                         seconds=time.monotonic() - started)

    def _run(self, build: BuildResult, commit: Commit, folder: Path) -> tuple[TestOutcome, ...]:
        folder.mkdir(parents=True, exist_ok=True)
        record = folder / "run.json"
        record.unlink(missing_ok=True)
        argv = [sys.executable, "-m", "pytest",
                *(str(SUITES_ROOTDIR / node_id) for node_id in self.node_ids),
                *suites_pytest_config(folder), "-p", "no:cacheprovider",
                f"--harness-server-bin={build.binary}", f"--harness-run-record={record}"]
        log = folder / "pytest.log"
        with log.open("w", encoding="utf-8") as out:
            run_step(argv, step="the suite tests", limit_s=self.limit_s, error=JudgeError,
                     log_path=log, setting="harness bisect --judge-limit-s",
                     on_line=lambda line: out.write(line + "\n"),
                     env={**os.environ, "HARNESS_RUN_ID": new_run_id(),
                          **probe_environment(build, commit)})
        if not record.is_file():
            raise JudgeError(f"pytest wrote no run record for {short_commit(commit.sha)}; its "
                             f"output is in {log}")
        return parse_run_json(record.read_bytes(), source=str(record)).outcomes


def _failing(outcomes: Sequence[TestOutcome]) -> list[TestOutcome]:
    return [o for o in outcomes if o.outcome not in _PASSING]


def verdict_of_tries(node_ids: Sequence[str],
                     tries: Sequence[Sequence[TestOutcome]]) -> tuple[Verdict, str]:
    """The verdict of one probe's tries, oldest first, and its evidence (pure).

    A named test the run did not report at all (a typo, a test the build's plan
    deselects) is an error of the bisect, not a verdict.
    """
    last = {o.test_id: o for o in tries[-1]}
    missing = [n for n in node_ids if not any(t.startswith(n) for t in last)]
    if missing:
        raise JudgeError(f"the run reported no outcome for {', '.join(missing)}: check "
                         "the node ids against `pytest --collect-only`")
    failing = _failing(tries[-1])
    if not failing:
        flaky = len(tries) > 1
        return Verdict.GOOD, (f"passed on try {len(tries)} of {len(tries)} (the earlier "
                              "failure counted as a flake)" if flaky else "passed")
    parts = [f"{o.test_id} {o.outcome.value}" + (f": {_one_line(o.message)}" if o.message
                                                  else "") for o in failing]
    times = f" on {len(tries)} tries" if len(tries) > 1 else ""
    return Verdict.BAD, "; ".join(parts) + times


def _one_line(message: str, limit: int = 200) -> str:
    text = " ".join(message.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
