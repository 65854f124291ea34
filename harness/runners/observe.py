"""Lets the harness watch every server start and stop, whoever started it.

Suites start servers in several ways (the ``start_server`` and ``launch`` fixtures, a
``LaunchSupervisor``, a runner called directly); the report and the performance figures
need all of them. Runners, the readiness wait and the supervisor tell the observers
registered here what happened. An observer that fails is reported as a warning and
never breaks the start or stop it watched: a figure is worth less than the test.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from harness.planning.launch import LaunchSpec
from harness.runners.base import RunningServer


class ServerObserver(Protocol):
    def planned(self, plan: Any) -> None:
        """A launch plan was made for the test (``LaunchPlan``; Any keeps this module low)."""
    def launched(self, server: RunningServer, spec: LaunchSpec) -> None:
        """The process or container was started (not yet ready)."""

    def ready(self, server: RunningServer) -> None:
        """Every readiness condition held: the server serves."""

    def stopping(self, server: RunningServer) -> None:
        """The server is still alive and about to be stopped."""

    def supervised(self, attempts: Sequence[Any], notes: Sequence[str]) -> None:
        """A supervised launch ended (served or gave up) after these attempts."""


_observers: list[ServerObserver] = []
_lock = threading.Lock()


def add_observer(observer: ServerObserver) -> None:
    with _lock:
        _observers.append(observer)


def remove_observer(observer: ServerObserver) -> None:
    with _lock:
        if observer in _observers:
            _observers.remove(observer)


def _each(call: Callable[[ServerObserver], None], event: str) -> None:
    with _lock:
        observers = list(_observers)
    for observer in observers:
        try:
            call(observer)
        except Exception as exc:  # an observer must never break a start or a stop
            warnings.warn(f"server observer {type(observer).__name__} failed on {event}: "
                          f"{exc}", RuntimeWarning, stacklevel=3)


def notify_planned(plan: Any) -> None:
    _each(lambda o: o.planned(plan), "planned")


def notify_launched(server: RunningServer, spec: LaunchSpec) -> None:
    _each(lambda o: o.launched(server, spec), "launched")


def notify_ready(server: RunningServer) -> None:
    _each(lambda o: o.ready(server), "ready")


def notify_stopping(server: RunningServer) -> None:
    _each(lambda o: o.stopping(server), "stopping")


def notify_supervised(attempts: Sequence[Any], notes: Sequence[str]) -> None:
    _each(lambda o: o.supervised(attempts, notes), "supervised")
