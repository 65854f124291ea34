"""Server observers against real servers: the recorder's story and figures, a failing observer.

Each test registers its own observer and removes it again; the session's own recorder
(the harness plugin's) watches the same servers beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from harness import modelgen
from harness.errors import ServerExitedError
from harness.planning.launch import LaunchSpec
from harness.plugin import PlanFor
from harness.plugin.recording.recorder import MeasureSettings, ServerRecorder
from harness.runners.base import RunningServer
from harness.runners.observe import (
    add_observer,
    notify_planned,
    remove_observer,
)
from harness.runners.subprocess_runner import SubprocessRunner

pytestmark = pytest.mark.server

MEASURED = {"decode_tps", "prompt_tps", "ttft_ms", "load_s", "kv_mib", "peak_host_mib"}
SPEED = MeasureSettings(enabled=True, n_prompt=8, n_gen=8, repetitions=2)


@pytest.fixture
def dense(fixture_set: modelgen.FixtureSet) -> LaunchSpec:
    return LaunchSpec(model=fixture_set.model("dense"), ctx_size=512, parallel=1)


def _watching(settings: MeasureSettings) -> Iterator[ServerRecorder]:
    recorder = ServerRecorder(settings)
    add_observer(recorder)
    try:
        yield recorder
    finally:
        remove_observer(recorder)


@pytest.fixture
def measuring() -> Iterator[ServerRecorder]:
    yield from _watching(SPEED)


@pytest.fixture
def story_only() -> Iterator[ServerRecorder]:
    yield from _watching(MeasureSettings(enabled=False))


# -- the recorder ------------------------------------------------------------------------


def test_a_served_start_is_measured_before_it_stops(server_runner: SubprocessRunner,
                                                    dense: LaunchSpec,
                                                    measuring: ServerRecorder) -> None:
    server = server_runner.start(dense)
    pid = server.pid
    server.stop()
    capture = measuring.take()
    (record,) = capture.servers
    # Under xdist the runner fills in each worker's share of the cores.
    assert dataclasses.replace(record.spec, threads=None) == dense
    assert record.argv == server.argv
    assert record.log_path == server.log_path
    assert record.ready_at is not None
    assert record.load_s is not None
    assert record.load_s > 0
    assert record.props is not None
    assert record.props["model_path"] == str(dense.model)
    assert record.measure_error is None
    assert set(record.figures) >= MEASURED, record.figures
    assert "peak_vram_mib" not in record.figures, "no NVML here: the figure is left out"
    assert all(value > 0 for value in record.figures.values()), record.figures
    assert record.figures["load_s"] == record.load_s
    assert record.key is not None
    assert (record.key.fixture, record.key.backend, record.key.gpu) == ("dense", "cpu", "none")
    assert (record.key.n_prompt, record.key.n_gen) == (SPEED.n_prompt, SPEED.n_gen)
    assert record.exit_code is not None, f"pid {pid} was stopped before take()"
    assert capture.plans == ()
    assert capture.supervised == ()


def test_take_forgets_what_it_returned(server_runner: SubprocessRunner, dense: LaunchSpec,
                                       story_only: ServerRecorder) -> None:
    with server_runner.start(dense):
        pass
    assert len(story_only.take().servers) == 1
    empty = story_only.take()
    assert (empty.servers, empty.plans, empty.supervised) == ((), (), ())


def test_with_measuring_off_the_story_is_kept_without_figures(
        server_runner: SubprocessRunner, dense: LaunchSpec,
        story_only: ServerRecorder) -> None:
    with server_runner.start(dense):
        pass
    (record,) = story_only.take().servers
    assert record.ready_at is not None
    assert record.props is not None
    assert (record.figures, record.key, record.measure_error) == ({}, None, None)


def test_a_start_that_never_served_has_an_exit_code_and_no_figures(
        server_runner: SubprocessRunner, dense: LaunchSpec,
        fixture_set: modelgen.FixtureSet, measuring: ServerRecorder) -> None:
    broken = LaunchSpec(model=dense.model, ctx_size=512, spec_type="draft-simple",
                        drafter=fixture_set.model("drafter-corrupt"))
    with pytest.raises(ServerExitedError):
        server_runner.start(broken)
    (record,) = measuring.take().servers
    assert dataclasses.replace(record.spec, threads=None) == broken
    assert record.ready_at is None
    assert record.load_s is None
    assert record.props is None
    assert (record.figures, record.key) == ({}, None)
    assert record.exit_code == 1


def test_a_plan_reported_twice_is_kept_once(plan_for: PlanFor,
                                            story_only: ServerRecorder) -> None:
    plan = plan_for(model="dense")  # reports the plan once
    other = plan_for(model="moe")
    notify_planned(plan)  # as the launch fixture and the supervisor do again
    capture = story_only.take()
    assert len(capture.plans) == 2
    assert capture.plans[0] is plan
    assert capture.plans[1] is other
    assert story_only.take().plans == ()


# -- observers that fail -----------------------------------------------------------------


class StopBreaker:
    """An observer whose ``stopping`` raises; the others record what they saw."""

    def __init__(self) -> None:
        self.events: list[str] = []

    def planned(self, plan: Any) -> None:
        self.events.append("planned")

    def launched(self, server: RunningServer, spec: LaunchSpec) -> None:
        self.events.append("launched")

    def ready(self, server: RunningServer) -> None:
        self.events.append("ready")

    def stopping(self, server: RunningServer) -> None:
        self.events.append("stopping")
        raise RuntimeError("the figures store is down")

    def supervised(self, attempts: Sequence[Any], notes: Sequence[str]) -> None:
        self.events.append("supervised")


def test_an_observer_that_fails_on_stop_does_not_stop_the_stop(
        server_runner: SubprocessRunner, dense: LaunchSpec) -> None:
    breaker = StopBreaker()
    add_observer(breaker)
    try:
        server = server_runner.start(dense)
        with pytest.warns(RuntimeWarning,
                          match=r"server observer StopBreaker failed on stopping: "
                                r"the figures store is down"):
            code = server.stop()
    finally:
        remove_observer(breaker)
    assert code is not None
    assert server.exit_code() is not None
    assert breaker.events == ["launched", "ready", "stopping"]


def test_a_removed_observer_hears_nothing_more(server_runner: SubprocessRunner,
                                               dense: LaunchSpec, plan_for: PlanFor,
                                               story_only: ServerRecorder) -> None:
    breaker = StopBreaker()
    add_observer(breaker)
    remove_observer(breaker)
    remove_observer(breaker)  # removing twice is harmless
    with server_runner.start(dense):
        pass
    plan_for(model="dense")
    assert breaker.events == []
    # The observer still registered saw all of it.
    capture = story_only.take()
    assert len(capture.servers) == 1
    assert len(capture.plans) == 1

