"""The launch supervisor: start a plan, and when the start fails, retry it the safe way.

Ported behaviour (references 002 and 003 in docs/references.md, launch recovery):

- a start broken by the drafter (``failed to load draft model``) or by an MTP head that
  cannot run (``failed to create MTP context``) marks that drafter broken for this build
  (``BrokenDrafters``, keyed by the build and the drafter file; a model drafting with its
  own MTP head is keyed by the model file) and retries the same launch without
  speculative decoding. A drafter already marked broken is left out before the first
  start, and a planner given ``broken.snapshot()`` leaves it out of later plans;
- a GPU out-of-memory start steps one rung down the offload ladder (``ladder.py``: the
  plan's offload first, then ``next_rung`` after each OOM) and retries, until the ladder
  says nothing safer is left. A plan spread over a device list first moves units off the
  device the server named (``device_retreat.py``), one step per start, while they fit on
  the others;
- a start that crashed (killed by a signal) while the launch had a drafter or an MTP
  head blames the drafter first, as reference 002 does: drafters change format between
  engine releases, and without them the crash would count against the build;
- a crash without one, or a build that cannot run on this CPU (SIGILL), is a strike
  against the build for this model (``strikes.py``, kept in the harness cache); it is not
  retried, a good start clears the strikes, and after ``QUARANTINE_STRIKES`` in a row the
  build is not started again with that model: ``QuarantinedError`` says why and how to
  lift it;
- anything else is not a failure a retry can fix: ``LaunchFailedError`` is raised; a
  flag the launch sent that the server refused is named a harness bug
  (``verdicts/refused_flag.py``).

A plan that needs a feature the build lacks is never started: ``launch`` raises
``UnsupportedByBuildError`` before the first start (the plugin turns it into a skip).

A launch's starts share one deadline (``deadline_s``; by default the longer of
``DEFAULT_LAUNCH_DEADLINE_S`` and one readiness timeout): each start's readiness wait is
clipped to the time left, and no retry starts once it has passed, so a launch whose
starts keep failing ends with its story well before pytest-timeout would end the test.

Every start is recorded as an ``Attempt``: what was launched, its log, how it failed and
what the supervisor did about it. The attempts come back with the server, or on the
error when no start served, so a report can always show the whole story.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from harness.errors import ServerError, ServerExitedError, ServerNotReadyError
from harness.facts.model_facts import ModelFacts
from harness.planning.drafter import DRAFT_MTP, BrokenDrafters
from harness.planning.ladder import DEFAULT_MIN_CTX_SIZE, Rung, end_reason, next_rung
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import LaunchPlan
from harness.planning.multi_device import DevicePlan
from harness.planning.offload import OffloadPlan
from harness.planning.retry import apply_rung, starting_rung, without_drafter
from harness.runners.base import RunningServer, ServerRunner
from harness.runners.observe import notify_planned, notify_supervised
from harness.runners.readiness import wait_until_ready
from harness.supervise.cannot_run import cannot_run_here
from harness.supervise.device_retreat import device_retreat
from harness.supervise.strikes import (
    STRIKING,
    QuarantinedError,
    StrikeBook,
    cache_book,
    strike_words,
)
from harness.verdicts.failure import (
    FIXES,
    FailureClass,
    StartFailure,
    classify_start_failure,
    start_failed_headline,
)
from harness.verdicts.refused_flag import refusal_verdict

#: How much of an attempt's log is kept in its record (the tail; a tiny-model start log
#: is tens of KiB, and at ``-lv 5`` a few hundred at most).
LOG_KEEP_CHARS = 512 * 1024
#: A bound on starts per launch. The ladder is finite and the drafter goes at most once,
#: so this only guards against a runner that misbehaves.
DEFAULT_MAX_ATTEMPTS = 32
#: Seconds all the starts of one launch may take together (unless the runner's readiness
#: timeout is longer: then one full wait). An out-of-memory start fails in seconds, so
#: this leaves room for a whole ladder; it ends a launch whose starts each hang, half of
#: pytest-timeout's 600 s into the test.
DEFAULT_LAUNCH_DEADLINE_S = 300.0


class AttemptOutcome(enum.StrEnum):
    """How one start ended, for the supervisor (our own design).

    ``served`` and ``gave up`` end a launch and are the first words of the attempt's
    ``action`` (what the report's attempts attachment and LaunchFailedError show);
    ``retried`` is followed by another start, and its action says what it changed.
    """

    SERVED = "served"
    RETRIED = "retried"
    GAVE_UP = "gave up"


S = TypeVar("S", bound=RunningServer)


@dataclass(frozen=True)
class Attempt:
    """One start: what was launched, how it ended and what the supervisor did next."""

    number: int
    spec: LaunchSpec
    argv: tuple[str, ...]
    log_path: Path
    #: The log as the start left it (its last ``LOG_KEEP_CHARS`` characters).
    log_text: str
    #: None when this start served.
    failure: StartFailure | None
    #: ``served``, or the retry taken, or ``gave up: <why>``.
    action: str
    #: The offload-ladder rung this start ran on.
    rung: Rung
    #: How the start ended; ``action`` says it in words.
    outcome: AttemptOutcome


@dataclass(frozen=True)
class SupervisedLaunch(Generic[S]):
    """A ready server (the caller stops it) and every start it took to get there."""

    server: S
    attempts: tuple[Attempt, ...]
    #: What was changed before the first start (a drafter already known broken).
    notes: tuple[str, ...] = ()
    #: The spread the serving start sent (a device retreat may have changed the plan's).
    devices: DevicePlan | None = None


class LaunchFailedError(ServerError):
    """No start served: the last failure, every attempt, and why nothing more was tried."""

    def __init__(self, failure: StartFailure, attempts: tuple[Attempt, ...],
                 reason: str) -> None:
        self.failure = failure
        self.attempts = attempts
        self.reason = reason
        super().__init__(_failure_message(failure, attempts, reason))


@dataclass(frozen=True)
class _Retry:
    spec: LaunchSpec
    rung: Rung
    action: str
    #: The spread the next start sends, when a device retreat changed it.
    devices: DevicePlan | None = None


class LaunchSupervisor(Generic[S]):
    """Starts launches of one model on one build, retrying as the module docstring says.

    Any runner will do: it launches with ``runner.launch`` and waits itself, with the
    runner's conditions and timeout, so that it can read how a start failed.
    """

    def __init__(self, runner: ServerRunner[S], build_key: str, broken: BrokenDrafters,
                 model_facts: ModelFacts, *, min_ctx_size: int = DEFAULT_MIN_CTX_SIZE,
                 max_attempts: int = DEFAULT_MAX_ATTEMPTS,
                 deadline_s: float | None = None,
                 strikes: StrikeBook | None = None,
                 cmake_flags: Sequence[str] | None = None) -> None:
        self._runner = runner
        #: Crashed starts per build and model (default: the harness cache's book).
        self._strikes = strikes or cache_book()
        #: The build's CMake flags (BuildInfo.cmake_flags), to name the instruction sets a
        #: build that cannot run here asked for; None: not known.
        self._cmake_flags = cmake_flags
        self._build_key = build_key
        self._broken = broken
        self._model = model_facts
        self._min_ctx_size = min_ctx_size
        self._max_attempts = max_attempts
        self._deadline_s = deadline_s

    @property
    def deadline_s(self) -> float:
        """Seconds one launch's starts may take together."""
        if self._deadline_s is not None:
            return self._deadline_s
        return max(DEFAULT_LAUNCH_DEADLINE_S, self._runner.ready_timeout_s)

    def launch(self, plan: LaunchPlan) -> SupervisedLaunch[S]:
        """Start ``plan``; its offload plan is the top of the ladder an OOM walks down.

        Raises ``UnsupportedByBuildError``, starting nothing, when the build lacks a
        feature the plan needs.
        """
        plan.ensure_sendable()
        notify_planned(plan)
        return self.launch_spec(plan.spec, plan.offload, plan.devices)

    def launch_spec(self, spec: LaunchSpec, offload: OffloadPlan | None = None,
                    devices: DevicePlan | None = None) -> SupervisedLaunch[S]:
        """Start ``spec`` (with ``offload`` as the ladder's top; None: the spec's own flags;
        ``devices``: the spread ``spec`` sends, which a device's out-of-memory start retreats).

        Returns the ready server and every attempt; raises ``LaunchFailedError`` (with the
        attempts) when no start served, ``QuarantinedError`` (starting nothing) when the
        build crashed ``QUARANTINE_STRIKES`` starts in a row with this model.
        """
        quarantined = self._strikes.quarantine(self._build_key, spec.model)
        if quarantined is not None:
            raise QuarantinedError(quarantined)
        notes: list[str] = []
        spec = self._leave_out_known_broken(spec, notes)
        rung = starting_rung(self._model, offload, spec)
        attempts: list[Attempt] = []
        deadline = time.monotonic() + self.deadline_s
        while True:
            wait_s = min(self._runner.ready_timeout_s, deadline - time.monotonic())
            server, failure = self._start(spec, wait_s)
            record = _AttemptRecord(len(attempts) + 1, spec, server, failure, rung)
            if failure is None:
                self._strikes.clear(self._build_key, spec.model)
                attempts.append(record.done(AttemptOutcome.SERVED))
                notify_supervised(attempts, notes)
                return SupervisedLaunch(server, tuple(attempts), tuple(notes), devices)
            step = self._recovery(spec, rung, failure, [a.rung for a in attempts] + [rung],
                                  devices=devices, log_text=server.log_text())
            if isinstance(step, str) and failure.kind in STRIKING:
                step += self._strike(spec, failure, server.log_text())
            if isinstance(step, _Retry) and record.number >= self._max_attempts:
                step = (f"{record.number} starts failed and the supervisor gives up after "
                        f"{self._max_attempts}")
            if time.monotonic() >= deadline and (isinstance(step, _Retry)
                                                 or _cut_short(failure, wait_s, self._runner)):
                step = (f"the launch's deadline ran out: its starts may take "
                        f"{self.deadline_s:g}s together (LaunchSupervisor deadline_s, by "
                        "default the longer of harness.supervise.supervisor."
                        "DEFAULT_LAUNCH_DEADLINE_S and one readiness timeout)")
            if isinstance(step, str):
                attempts.append(record.done(AttemptOutcome.GAVE_UP, step))
                notify_supervised(attempts, notes)
                failed = LaunchFailedError(failure, tuple(attempts), step)
                if failure.kind is FailureClass.CANNOT_RUN_HERE:
                    # Not the code's regression but the host's: the test skips with it.
                    raise cannot_run_here(failure, self._cmake_flags,
                                          server.argv[0] if server.argv else "llama-server",
                                          ) from failed
                raise failed
            attempts.append(record.done(AttemptOutcome.RETRIED, step.action))
            spec, rung, devices = step.spec, step.rung, step.devices or devices

    def _start(self, spec: LaunchSpec, wait_s: float) -> tuple[S, StartFailure | None]:
        server = self._runner.launch(spec)
        try:
            wait_until_ready(server, self._runner.conditions, wait_s)
        except ServerExitedError:
            code = server.exit_code()
            server.stop()
            return server, classify_start_failure(code, server.log_text(), timed_out=False)
        except ServerNotReadyError:
            code = server.exit_code()
            server.stop()
            return server, classify_start_failure(code, server.log_text(), timed_out=True)
        except BaseException:
            server.stop()
            raise
        return server, None

    def _leave_out_known_broken(self, spec: LaunchSpec, notes: list[str]) -> LaunchSpec:
        broken = self._broken.snapshot()
        key = _drafter_key(spec)
        if key is not None and (self._build_key, key) in broken:
            notes.append(f"left out {_drafter_words(spec)} before the first start: it broke an "
                         f"earlier start of build {self._build_key}")
            return without_drafter(spec)
        return spec

    def _strike(self, spec: LaunchSpec, failure: StartFailure, log_text: str) -> str:
        """Record ``failure`` against the build for this model; what that means, in words."""
        strikes = self._strikes.record(self._build_key, spec.model, failure, log_text)
        return "; " + strike_words(self._build_key, strikes,
                                   self._strikes.path(self._build_key, spec.model))

    def _recovery(self, spec: LaunchSpec, rung: Rung, failure: StartFailure,
                  tried: list[Rung], *, devices: DevicePlan | None,
                  log_text: str) -> _Retry | str:
        """The retry for ``failure``, or why there is none."""
        drafter = _drafter_key(spec)
        if failure.kind is FailureClass.CRASH and drafter is not None:
            # The drafter is the one part of the launch it can do without (reference 002).
            self._broken.mark(self._build_key, drafter)
            return _Retry(without_drafter(spec), rung,
                          f"crashed with {_drafter_words(spec)}: blamed it before the build, "
                          f"marked it broken for build {self._build_key} and retried without "
                          "speculative decoding")
        if failure.kind in (FailureClass.DRAFTER_LOAD, FailureClass.MTP_CONTEXT):
            key = _drafter_key(spec)
            if key is None:
                return (f"the server reported {failure.kind.value}, but this launch has no "
                        "drafter or spec type to leave out")
            self._broken.mark(self._build_key, key)
            return _Retry(without_drafter(spec), rung,
                          f"marked {_drafter_words(spec)} broken for build {self._build_key} "
                          "and retried without speculative decoding")
        if failure.kind is FailureClass.OUT_OF_MEMORY:
            retreat = (device_retreat(self._model, spec, devices, log_text)
                       if devices is not None else None)
            if retreat is not None:
                return _Retry(retreat.spec, rung, retreat.action, retreat.plan)
            following = next_rung(rung, self._min_ctx_size)
            if following is None:
                listed = "; ".join(f"{i}. {r.label}" for i, r in enumerate(_unique(tried), 1))
                return (f"out of memory on every rung of the offload ladder (tried: {listed}); "
                        f"{end_reason(rung, self._min_ctx_size)}")
            return _Retry(apply_rung(spec, following), following,
                          f"stepped down the offload ladder to {following.label} "
                          f"({following.reason})")
        fix = FIXES.get(failure.kind) or refusal_verdict(failure, spec)
        return (f"{failure.kind.value} is not a failure a retry can fix"
                + (f"; {fix}" if fix else ""))


@dataclass(frozen=True)
class _AttemptRecord:
    number: int
    spec: LaunchSpec
    server: RunningServer
    failure: StartFailure | None
    rung: Rung

    def done(self, outcome: AttemptOutcome, detail: str = "") -> Attempt:
        """The attempt, ended by ``outcome``; ``detail``: the retry taken, or why not."""
        if outcome is AttemptOutcome.GAVE_UP:
            action = f"{outcome.value}: {detail}"
        elif outcome is AttemptOutcome.RETRIED:
            action = detail
        else:
            action = outcome.value
        return Attempt(self.number, self.spec, tuple(self.server.argv), self.server.log_path,
                       self.server.log_text()[-LOG_KEEP_CHARS:], self.failure, action,
                       self.rung, outcome)


def _cut_short(failure: StartFailure, wait_s: float,
               runner: ServerRunner[RunningServer]) -> bool:
    """Whether ``failure`` is a readiness wait the launch's deadline had shortened."""
    return failure.kind is FailureClass.READINESS_TIMEOUT and wait_s < runner.ready_timeout_s


def _drafter_key(spec: LaunchSpec) -> str | None:
    """The file a broken speculative start is remembered by: the drafter, else the model
    when it drafts with its own MTP head; None when the launch does not speculate."""
    if spec.drafter is not None:
        return str(spec.drafter)
    if spec.spec_type == DRAFT_MTP:
        return str(spec.model)
    return None


def _drafter_words(spec: LaunchSpec) -> str:
    if spec.drafter is not None:
        return f"the drafter {spec.drafter}"
    return f"the MTP head of {spec.model}"


def _unique(rungs: list[Rung]) -> list[Rung]:
    seen: list[Rung] = []
    for rung in rungs:
        if rung not in seen:
            seen.append(rung)
    return seen


def _failure_message(failure: StartFailure, attempts: tuple[Attempt, ...], reason: str) -> str:
    lines = [start_failed_headline(len(attempts), failure), f"why no further retry: {reason}"]
    for attempt in attempts:
        outcome = str(attempt.failure) if attempt.failure else attempt.outcome.value
        # The last attempt's action repeats the reason printed above.
        then = (attempt.outcome.value if attempt.outcome is AttemptOutcome.GAVE_UP
                else attempt.action)
        lines += [f"  attempt {attempt.number} ({attempt.rung.label}): {outcome}",
                  f"    then: {then}",
                  f"    argv: {' '.join(attempt.argv)}",
                  f"    log: {attempt.log_path}"]
    lines.append("hint: the server's own words are quoted above; each attempt's full log is "
                 "at its path")
    return "\n".join(lines)
