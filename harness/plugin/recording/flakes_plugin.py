"""Known flakes in a run: an expired entry stops the run, a listed failure stays visible.

Registered by ``harness.plugin``. At session start (the controller only) any expired
entry of the known-flakes file ends the run with a usage error naming it. A listed test
that fails on matching hardware is neither retried nor hidden: its report becomes an
expected failure whose reason is the entry's ("known flake: <reason> (<tracking>)"), so
pytest prints it as XFAIL, the gate does not fail on it, and its Allure result carries a
``known_flake`` label and lands in the "Known flake" category. A listed test that
passes is simply passed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import allure
import pytest

from harness.plugin.flakes import KnownFlakes, KnownFlakesError, load_known_flakes
from harness.probes.hardware import detect_hardware
from harness.resources import resource_path
from harness.results.run_record import Hardware

DEFAULT_PATH = resource_path("known-flakes.yaml")
#: Values of --harness-known-flakes that turn the list off (``harness repro`` does).
DISABLED = ("", "none")
LABEL = "known_flake"
#: allure-pytest ships no type hints; every call goes through this one untyped name.
_dynamic: Any = allure.dynamic


def known_flakes_path(option: str | None) -> Path | None:
    """The file to use: the option's, else the repository's when it has one, else none."""
    if option is None:
        return DEFAULT_PATH if DEFAULT_PATH.is_file() else None
    if option.strip().lower() in DISABLED:
        return None
    return Path(option).expanduser()


def expired_message(flakes: KnownFlakes, today: dt.date) -> str | None:
    """Why the run must stop, naming each expired entry; None when none has expired."""
    expired = flakes.expired(today)
    if not expired:
        return None
    lines = [f"{flakes.source}: {len(expired)} known-flake entr"
             f"{'y has' if len(expired) == 1 else 'ies have'} expired:"]
    lines += [f"  {e.describe()}: expired {e.expires.isoformat()} (reason: {e.reason}; "
              f"tracking: {e.tracking})" for e in expired]
    lines.append("Fix the test and delete the entry, or, after a review that it is still a "
                 "known flake, renew the entry with a new expires date.")
    return "\n".join(lines)


class KnownFlakesPlugin:
    def __init__(self, config: pytest.Config, flakes: KnownFlakes,
                 today: Callable[[], dt.date] = dt.date.today) -> None:
        self.config = config
        self.flakes = flakes
        self.today = today

    @classmethod
    def from_option(cls, config: pytest.Config, option: str | None) -> KnownFlakesPlugin | None:
        """The plugin for ``--harness-known-flakes`` (or its variable), None when off."""
        path = known_flakes_path(option)
        if path is None:
            return None
        try:
            return cls(config, load_known_flakes(path))
        except KnownFlakesError as exc:
            raise pytest.UsageError(str(exc)) from exc

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        if hasattr(session.config, "workerinput"):
            return  # the controller checks once for the whole run
        message = expired_message(self.flakes, self.today())
        if message is not None:
            pytest.exit(message, returncode=pytest.ExitCode.USAGE_ERROR)

    # Innermost of the report wrappers (trylast), so allure-pytest and the recording
    # plugin, wrapped around it, already see the expected failure.
    @pytest.hookimpl(wrapper=True, trylast=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo[None]
                                  ) -> Generator[None, pytest.TestReport, pytest.TestReport]:
        report = yield
        if report.when in ("setup", "call") and report.failed:
            entry = self.flakes.match(item.nodeid, self._hardware())
            if entry is not None:
                report.outcome = "skipped"
                report.wasxfail = entry.outcome_reason()
                _dynamic.label(LABEL, f"{entry.reason} ({entry.tracking})")
        return report

    def _hardware(self) -> Hardware:
        recording = self.config.pluginmanager.get_plugin("harness-recording")
        hardware = getattr(recording, "hardware", None)
        return hardware if isinstance(hardware, Hardware) else detect_hardware()
