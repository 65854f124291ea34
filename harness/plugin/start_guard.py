"""The server runner as the suites' fixtures start servers with it: strikes and SIGILL.

``start_server`` and ``launch`` start a server in one step (``runner.start``), without
the launch supervisor. Their runner is wrapped so that those starts keep the same book
(harness/supervise/strikes.py): a quarantined build is not started, a crashed start is
a strike (noted on the error the test shows), a good start clears the strikes, and a
build that dies of an instruction this CPU lacks raises ``CannotRunHereError``, which the
feature gate (harness/plugin/features.py) turns into a skip, or a failure under
``--harness-require-features``.
"""

from __future__ import annotations

from collections.abc import Sequence

from harness.builds.under_test import BuildUnderTest
from harness.errors import ServerExitedError
from harness.planning.launch import LaunchSpec
from harness.runners.base import RunningServer, ServerRunner, WaitCondition
from harness.runners.external_runner import ExternalRunner
from harness.runners.launching import until_ready
from harness.supervise.cannot_run import cannot_run_here
from harness.supervise.strikes import (
    STRIKING,
    QuarantinedError,
    StrikeBook,
    cache_book,
    strike_words,
)
from harness.verdicts.failure import FailureClass, classify_start_failure


class GuardedRunner:
    """``runner`` with its ``start`` kept in ``book`` for ``build`` (a ``ServerRunner``)."""

    def __init__(self, runner: ServerRunner[RunningServer], build: BuildUnderTest,
                 book: StrikeBook | None = None) -> None:
        self.runner = runner
        self.build = build
        #: Default: the harness cache's book, the one the launch supervisor keeps.
        self.book = book or cache_book()

    @property
    def ready_timeout_s(self) -> float:
        return self.runner.ready_timeout_s

    @property
    def conditions(self) -> Sequence[WaitCondition]:
        return self.runner.conditions

    def launch(self, spec: LaunchSpec) -> RunningServer:
        return self.runner.launch(spec)

    def start(self, spec: LaunchSpec) -> RunningServer:
        if isinstance(self.runner, ExternalRunner):
            # A server someone else started: no start of the build to count, and the
            # runner's own words for one that is not up.
            return self.runner.start(spec)
        verdict = self.book.quarantine(self.build.key, spec.model)
        if verdict is not None:
            raise QuarantinedError(verdict)
        server = self.runner.launch(spec)
        try:
            until_ready(self.runner, server)
        except ServerExitedError as exc:
            log = server.log_text()
            failure = classify_start_failure(server.exit_code(), log, timed_out=False)
            if failure.kind in STRIKING:
                strikes = self.book.record(self.build.key, spec.model, failure, log)
                exc.add_note(f"{failure}: " + strike_words(
                    self.build.key, strikes, self.book.path(self.build.key, spec.model)))
            if failure.kind is FailureClass.CANNOT_RUN_HERE:
                flags = self.build.info.cmake_flags if self.build.info else None
                raise cannot_run_here(failure, flags, str(self.build.binary)) from exc
            raise
        self.book.clear(self.build.key, spec.model)
        return server
