"""The bisect loop: judge both endpoints, then probe until the first bad commit is
known, only skipped commits remain, or the budget is spent.

Every probe is exported, built through the cached build path (a tree built before is a
hit; ccache shares what nearby commits have in common), judged, written to the journal
and reported before the next one starts. Its export is removed once built; a commit
whose tree digest an earlier export recorded and whose build is in the cache is not
exported at all, and the run keeps each commit's build, so the endpoints a metric probe
asks for again cost nothing. A build that fails is a skip, with its error
as the evidence: the search goes on around it.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from harness.bisect.history import Commit
from harness.bisect.journal import Header, Journal, Probe
from harness.bisect.oracles import Oracle, ProbeContext
from harness.bisect.ranges import CommitRange
from harness.bisect.search import Parents, Verdict, Window, next_probe, window
from harness.builds.native import BuildResult, build_server, finished_build
from harness.errors import BuildError, ConfigError
from harness.facts.commit_ids import short_commit
from harness.planning.build_plan import BuildRequest

#: Exit codes: the first bad commit is known; a range of candidates is left (skipped
#: commits, or the budget ran out); the endpoints do not reproduce the regression.
FOUND, CANDIDATES, NOT_REPRODUCED = 0, 1, 2


@dataclass(frozen=True)
class Limits:
    #: Stop probing once this much time has passed (the endpoints always run).
    budget_s: float | None = None
    #: Stop probing once this many builds were compiled (cache hits do not count).
    max_builds: int | None = None


@dataclass(frozen=True)
class BisectSettings:
    range: CommitRange
    oracle: Oracle
    request: BuildRequest
    cache: Path
    out: Path
    journal: Path
    limits: Limits = Limits()
    #: This run's finished builds by commit id: a commit is exported and hashed once.
    built: dict[str, BuildResult] = field(default_factory=dict, repr=False, compare=False)

    @property
    def good(self) -> Commit:
        return self.range.good

    @property
    def bad(self) -> Commit:
        return self.range.bad


@dataclass(frozen=True)
class BisectResult:
    history: tuple[Commit, ...]
    probes: tuple[Probe, ...]
    #: None when an endpoint did not judge as it must.
    window: Window | None
    #: Why the search stopped short, when it did ("the budget of 600 s is spent").
    stopped: str | None = None
    #: The oracle, in its own words (Oracle.describe).
    oracle: str = ""

    @property
    def exit_code(self) -> int:
        if self.window is None:
            return NOT_REPRODUCED
        return FOUND if self.window.culprit is not None and self.stopped is None \
            else CANDIDATES

    def commit_at(self, index: int) -> Commit:
        return self.history[index]

    def to_json(self) -> dict[str, object]:
        found = self.window
        return {
            "commits": len(self.history),
            "good": self.history[0].sha, "bad": self.history[-1].sha, "oracle": self.oracle,
            "first_bad": (dataclasses.asdict(self.history[found.culprit])
                          if found is not None and found.culprit is not None else None),
            "candidates": ([dataclasses.asdict(self.history[i]) for i in found.candidates]
                           if found is not None else []),
            "stopped": self.stopped,
            "reproduced": found is not None,
            "probes": [p.to_json() for p in self.probes],
        }


def build_description(request: BuildRequest) -> str:
    """The build options in one stable line (the journal's header compares it)."""
    return json.dumps({**dataclasses.asdict(request), "backend": request.backend.value},
                      sort_keys=True)


ProbeReport = Callable[[Probe, BisectResult], None]
ProbeStart = Callable[[Commit], None]


def bisect(settings: BisectSettings, *, report: ProbeReport = lambda probe, state: None,
           starting: ProbeStart = lambda commit: None) -> BisectResult:
    """Run the bisect ``settings`` describe, resuming from its journal; ``starting`` and
    ``report`` hear of each probe before it is built and once it is judged."""
    history = tuple(settings.range.commits())
    parents = settings.range.parents()
    shas = [c.sha for c in history]
    journal = Journal(settings.journal, Header(
        tree=settings.range.describe(), good=settings.good.sha, bad=settings.bad.sha,
        oracle=settings.oracle.describe(), build=build_description(settings.request),
        first_parent=settings.range.first_parent))
    by_commit = {c.sha: c for c in history}
    if any(p.commit not in by_commit for p in journal.probes):
        raise ConfigError(f"{settings.journal} holds probes of commits outside this range: "
                          "the tree's history changed since; remove the journal to start over")
    started, builds = time.monotonic(), 0

    def state(window_now: Window | None, stopped: str | None = None) -> BisectResult:
        order = {c.sha: i for i, c in enumerate(history)}
        probes = tuple(sorted(journal.probes, key=lambda p: order[p.commit]))
        return BisectResult(history, probes, window_now, stopped,
                            oracle=settings.oracle.describe())

    def judged() -> dict[str, Verdict]:
        return {p.commit: p.verdict for p in journal.probes}

    def probe(commit: Commit) -> None:
        nonlocal builds
        starting(commit)
        done = _probe(settings, commit)
        builds += 0 if done.cache_hit or not done.build_key else 1
        journal.add(done)
        report(done, state(_window_or_none(shas, judged(), parents)))

    # Endpoints first: no search on a regression that does not reproduce.
    for endpoint, wanted in ((history[0], Verdict.GOOD), (history[-1], Verdict.BAD)):
        if endpoint.sha not in judged():
            probe(endpoint)
        if judged()[endpoint.sha] is not wanted:
            return state(None)
    while (commit_sha := next_probe(shas, judged(), parents)) is not None:
        spent = _spent(settings.limits, time.monotonic() - started, builds)
        if spent is not None:
            return state(window(shas, judged(), parents), spent)
        probe(by_commit[commit_sha])
    return state(window(shas, judged(), parents))


def _window_or_none(shas: list[str], verdicts: dict[str, Verdict],
                    parents: Parents) -> Window | None:
    try:
        return window(shas, verdicts, parents)
    except ValueError:  # an endpoint not judged yet, or not as it must be
        return None


def _spent(limits: Limits, elapsed_s: float, builds: int) -> str | None:
    if limits.budget_s is not None and elapsed_s >= limits.budget_s:
        return f"the budget of {limits.budget_s:g} s is spent ({elapsed_s:.0f} s)"
    if limits.max_builds is not None and builds >= limits.max_builds:
        return f"--max-builds {limits.max_builds} reached ({builds} compiled)"
    return None


def build_failure(message: str) -> str:
    """A failed build's evidence (pure): the step that failed, the first line of its log
    tail that says "error", and where the whole log is."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    step = lines[0] if lines else "the build failed"
    said = next((line for line in lines[1:] if "error" in line.lower()
                 and not line.startswith("---")), None)
    log = next((line.removeprefix("--- full log: ").removesuffix(" ---") for line in lines
                if line.startswith("--- full log: ")), None)
    return (f"build failed: {step}" + (f" {said}" if said else "") +
            (f" (log {log})" if log else ""))


def _build(settings: BisectSettings, commit: Commit) -> BuildResult:
    if (known := settings.built.get(commit.sha)) is not None:
        return dataclasses.replace(known, cache_hit=True)
    digest = settings.range.known_digest(commit, settings.cache)
    built = finished_build(settings.cache, digest, settings.request) if digest else None
    if built is None:
        with settings.range.source(commit, settings.cache) as source:
            built = build_server(settings.cache, source,
                                 settings.range.request(settings.request, source))
    settings.built[commit.sha] = built
    return built


def _probe(settings: BisectSettings, commit: Commit) -> Probe:
    started = time.monotonic()
    try:
        build = _build(settings, commit)
    except BuildError as exc:
        return Probe(commit=commit.sha, subject=commit.subject, verdict=Verdict.SKIP,
                     evidence=build_failure(str(exc)), build_key="",
                     build_s=time.monotonic() - started, judge_s=0.0, cache_hit=False)
    build_s = time.monotonic() - started
    context = ProbeContext(folder=settings.out / "probes" / short_commit(commit.sha),
                           good=settings.good, bad=settings.bad,
                           build_of=lambda endpoint: _build(settings, endpoint))
    judgement = settings.oracle.judge(build, commit, context)
    return Probe(commit=commit.sha, subject=commit.subject, verdict=judgement.verdict,
                 evidence=judgement.evidence, build_key=build.info.key, build_s=build_s,
                 judge_s=judgement.seconds, cache_hit=build.cache_hit,
                 ratio=judgement.ratio)
