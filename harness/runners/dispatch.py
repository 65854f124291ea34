"""Hands a launch plan to the backend its route names, unchanged.

Ported behaviour (reference 000, docs/references.md): the dispatcher forwards the whole
plan — catalog entry, bundle root, drafter, cache types, overrides — to the chosen
backend; nothing is rebuilt or dropped on the way, so what reaches the server is what was
planned.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

from harness.errors import ConfigError
from harness.planning.launch_plan import LaunchPlan
from harness.planning.routing import InferenceBackend
from harness.runners.base import RunningServer, ServerRunner


class PlanBackend(Protocol):
    def load(self, plan: LaunchPlan) -> RunningServer: ...


class LlamaCppBackend:
    """The llama-cpp backend: starts a llama-server for the plan's launch spec."""

    def __init__(self, runner: ServerRunner[RunningServer]) -> None:
        self.runner = runner

    def load(self, plan: LaunchPlan) -> RunningServer:
        return self.runner.start(plan.spec)


class Dispatcher:
    def __init__(self, backends: Mapping[InferenceBackend, PlanBackend]) -> None:
        self.backends = dict(backends)

    def dispatch(self, plan: LaunchPlan) -> RunningServer:
        backend = self.backends.get(plan.route.backend)
        if backend is None:
            known = ", ".join(b.value for b in self.backends) or "none"
            raise ConfigError(f"the plan routes to {plan.route.backend.value!r} "
                              f"({plan.route.detail}), but no such backend is set up; "
                              f"set up: {known}")
        return backend.load(plan)
