"""Collects, for the test now running, every plan made and every server started.

A ``ServerRecorder`` is registered once per process as a server observer; pytest runs
one test at a time per process, so whatever it sees between two ``take()`` calls belongs
to one test. A server is measured just before it is stopped (it is still alive then,
whoever stops it), and only if it became ready.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.client import ServerClient, shared_pool
from harness.errors import HarnessError
from harness.perf.keys import (
    DEFAULT_GEN_TOKENS,
    DEFAULT_PROMPT_TOKENS,
    DEFAULT_REPETITIONS,
    figure_key,
)
from harness.perf.measure import kv_mib, measure_speed, peak_host_mib, vram_mib
from harness.planning.launch import LaunchSpec
from harness.plugin.recording.prediction import predicted_decode_tps
from harness.results.run_record import NO_GPU, FigureKey
from harness.runners.base import RunningServer


@dataclass(frozen=True)
class MeasureSettings:
    """What to measure on each server; ``enabled`` False records the story only."""

    enabled: bool = False
    backend: str = "cpu"
    gpu: str = NO_GPU
    n_prompt: int = DEFAULT_PROMPT_TOKENS
    n_gen: int = DEFAULT_GEN_TOKENS
    repetitions: int = DEFAULT_REPETITIONS


@dataclass
class ServerRecord:
    spec: LaunchSpec
    argv: list[str]
    log_path: Path
    launched_at: float
    ready_at: float | None = None
    props: dict[str, Any] | None = None
    key: FigureKey | None = None
    figures: dict[str, float] = field(default_factory=dict)
    #: The bandwidth model's figure beside a measured one (``decode_tps``).
    predicted: dict[str, float] = field(default_factory=dict)
    measure_error: str | None = None
    exit_code: int | None = None

    @property
    def load_s(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.launched_at


@dataclass(frozen=True)
class SupervisedStory:
    attempts: tuple[Any, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class TestCapture:
    """Everything one test did with plans and servers, in order."""

    plans: tuple[Any, ...]
    servers: tuple[ServerRecord, ...]
    supervised: tuple[SupervisedStory, ...]


class ServerRecorder:
    """A ``ServerObserver`` that keeps the current test's plans, servers and figures."""

    def __init__(self, settings: MeasureSettings) -> None:
        self.settings = settings
        self._lock = threading.Lock()
        self._servers: dict[int, tuple[RunningServer, ServerRecord]] = {}
        self._plans: list[Any] = []
        self._supervised: list[SupervisedStory] = []

    def planned(self, plan: Any) -> None:
        with self._lock:
            # plan_for, the launch fixture and the supervisor may each report the same plan.
            if not any(known is plan for known in self._plans):
                self._plans.append(plan)

    def launched(self, server: RunningServer, spec: LaunchSpec) -> None:
        record = ServerRecord(spec=spec, argv=list(server.argv), log_path=server.log_path,
                              launched_at=time.monotonic())
        with self._lock:
            self._servers[id(server)] = (server, record)

    def ready(self, server: RunningServer) -> None:
        record = self._record(server)
        if record is None or record.ready_at is not None:
            return
        record.ready_at = time.monotonic()
        try:
            # The process-wide keep-alive pool, as readiness uses: every server passes here.
            with ServerClient(server.base_url, timeout_s=10.0, http=shared_pool()) as client:
                record.props = client.props().raw
        except HarnessError:
            record.props = None

    def stopping(self, server: RunningServer) -> None:
        record = self._record(server)
        if record is None or record.ready_at is None or record.figures or record.measure_error:
            return
        if self.settings.enabled:
            self._measure(server, record)

    def supervised(self, attempts: Sequence[Any], notes: Sequence[str]) -> None:
        with self._lock:
            self._supervised.append(SupervisedStory(tuple(attempts), tuple(notes)))

    def take(self) -> TestCapture:
        """What was recorded since the last call, and forget it."""
        with self._lock:
            entries = list(self._servers.values())
            capture = TestCapture(plans=tuple(self._plans),
                                  servers=tuple(record for _, record in entries),
                                  supervised=tuple(self._supervised))
            self._servers.clear()
            self._plans.clear()
            self._supervised.clear()
        for server, record in entries:
            record.exit_code = server.exit_code()
        return capture

    def _record(self, server: RunningServer) -> ServerRecord | None:
        with self._lock:
            entry = self._servers.get(id(server))
        return entry[1] if entry is not None and entry[0] is server else None

    def _measure(self, server: RunningServer, record: ServerRecord) -> None:
        s = self.settings
        record.key = figure_key(record.spec, backend=s.backend, gpu=s.gpu,
                                n_prompt=s.n_prompt, n_gen=s.n_gen)
        values: dict[str, float | None] = {"load_s": record.load_s}
        pid = _host_pid(server)
        try:
            speed = measure_speed(server.base_url, s.n_prompt, s.n_gen, s.repetitions)
        except HarnessError as exc:
            record.measure_error = str(exc)
        else:
            values.update(ttft_ms=speed.ttft_ms, prompt_tps=speed.prompt_tps,
                          decode_tps=speed.decode_tps)
        try:
            log_text = server.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            log_text = ""
        values.update(kv_mib=kv_mib(log_text), peak_host_mib=peak_host_mib(pid),
                      peak_vram_mib=vram_mib(pid))
        record.figures = {name: value for name, value in values.items() if value is not None}
        if "decode_tps" in record.figures:
            with self._lock:
                plans = list(self._plans)
            # The middle of the measured completions: the K/V read grows with the depth.
            guess = predicted_decode_tps(record.spec, plans, backend=s.backend, gpu_name=s.gpu,
                                         depth=s.n_prompt + s.n_gen // 2)
            if guess is not None:
                record.predicted = {"decode_tps": guess}


def _host_pid(server: RunningServer) -> int | None:
    pid = getattr(server, "pid", None)
    if isinstance(pid, int):
        return pid
    host_pid = getattr(server, "host_pid", None)
    if callable(host_pid):
        value = host_pid()
        return value if isinstance(value, int) else None
    return None
