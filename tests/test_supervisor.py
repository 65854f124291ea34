"""The launch supervisor against the real llama-server: every failure class, for real.

Each start below fails the way it does in the field, and the supervisor's record is read:
a corrupt drafter, ``draft-mtp`` on a model without an MTP head, a GPU out-of-memory start
(the OOM injector stands in for the GPU), an unknown flag, a file that is no GGUF, a
real SIGABRT (a glm4moe GGUF missing its ``nextn`` tensors trips a ``GGML_ASSERT``), a
server that never becomes ready (a FIFO as the model: the load blocks reading it), and a
flag with a bad value (``unknown``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gguf
import pytest

from harness import modelgen
from harness.builds.under_test import BuildUnderTest
from harness.client import ServerClient
from harness.errors import ServerError
from harness.planning.drafter import BrokenDrafters
from harness.planning.ladder import Step
from harness.planning.launch import LaunchSpec
from harness.probes.gguf_facts import read_model_facts
from harness.runners.base import WaitCondition
from harness.runners.subprocess_runner import SubprocessRunner, SubprocessServer
from harness.supervise.oom_injector import OOM_EXIT_CODE, make_oom_launcher, starts_seen
from harness.supervise.strikes import StrikeBook
from harness.supervise.supervisor import (
    AttemptOutcome,
    LaunchFailedError,
    LaunchSupervisor,
    SupervisedLaunch,
)
from harness.verdicts.failure import FailureClass, classify_start_failure

pytestmark = pytest.mark.server

Supervise = Callable[..., LaunchSupervisor[SubprocessServer]]


@pytest.fixture
def supervise(server_runner: SubprocessRunner, harness_build: BuildUnderTest,
              fixture_set: modelgen.FixtureSet, tmp_path: Path) -> Iterator[Supervise]:
    """``supervise(model_name, runner=None, broken=None)``; servers it starts are stopped.
    Crashes are counted in this test's own strike book, not the cache's."""
    made: list[_Tracking] = []

    def make(model: str, runner: SubprocessRunner | None = None,
             broken: BrokenDrafters | None = None) -> LaunchSupervisor[SubprocessServer]:
        tracking = _Tracking(runner or server_runner)
        made.append(tracking)
        return LaunchSupervisor(tracking, harness_build.key, broken or BrokenDrafters(),
                                read_model_facts(fixture_set.model(model)),
                                strikes=StrikeBook(tmp_path / "strikes"))

    yield make
    for tracking in made:
        for server in tracking.started:
            server.stop()


class _Tracking:
    """The runner as the supervisor sees it, remembering every server it launched."""

    def __init__(self, runner: SubprocessRunner) -> None:
        self.runner = runner
        self.started: list[SubprocessServer] = []

    @property
    def ready_timeout_s(self) -> float:
        return self.runner.ready_timeout_s

    @property
    def conditions(self) -> tuple[WaitCondition, ...]:
        return self.runner.conditions

    def launch(self, spec: LaunchSpec) -> SubprocessServer:
        server = self.runner.launch(spec)
        self.started.append(server)
        return server

    def start(self, spec: LaunchSpec) -> SubprocessServer:
        server = self.runner.start(spec)
        self.started.append(server)
        return server


def _serves(launch: SupervisedLaunch[SubprocessServer]) -> None:
    with ServerClient(launch.server.base_url) as client:
        assert client.completion("Once upon a time", n_predict=4).tokens_predicted >= 1


def test_a_corrupt_drafter_is_marked_broken_and_the_retry_serves(
        supervise: Supervise, fixture_set: modelgen.FixtureSet,
        harness_build: BuildUnderTest) -> None:
    broken = BrokenDrafters()
    drafter = fixture_set.model("drafter-corrupt")
    launch = supervise("dense", broken=broken).launch_spec(LaunchSpec(
        model=fixture_set.model("dense"), ctx_size=512, parallel=1, spec_type="draft-simple",
        drafter=drafter))
    first, second = launch.attempts
    assert first.failure is not None
    assert first.failure.kind is FailureClass.DRAFTER_LOAD
    assert first.failure.evidence.endswith(f"failed to load draft model, '{drafter}'")
    assert first.failure.exit_code == 1
    assert "--spec-draft-model" in first.argv
    assert "retried without speculative decoding" in first.action
    assert first.outcome is AttemptOutcome.RETRIED
    assert (second.failure, second.outcome, second.spec.drafter) == (
        None, AttemptOutcome.SERVED, None)
    assert "--spec-draft-model" not in second.argv
    assert (harness_build.key, str(drafter)) in broken.snapshot()
    _serves(launch)


def test_a_drafter_known_broken_is_left_out_before_the_first_start(
        supervise: Supervise, fixture_set: modelgen.FixtureSet,
        harness_build: BuildUnderTest) -> None:
    broken = BrokenDrafters()
    drafter = fixture_set.model("drafter-corrupt")
    broken.mark(harness_build.key, str(drafter))
    launch = supervise("dense", broken=broken).launch_spec(LaunchSpec(
        model=fixture_set.model("dense"), ctx_size=512, spec_type="draft-simple",
        drafter=drafter))
    assert [a.outcome for a in launch.attempts] == [AttemptOutcome.SERVED]
    assert len(launch.notes) == 1
    assert "it broke an earlier start" in launch.notes[0]


def test_draft_mtp_without_a_head_is_retried_without_it(
        supervise: Supervise, fixture_set: modelgen.FixtureSet,
        harness_build: BuildUnderTest) -> None:
    broken = BrokenDrafters()
    dense = fixture_set.model("dense")
    launch = supervise("dense", broken=broken).launch_spec(
        LaunchSpec(model=dense, ctx_size=512, parallel=1, spec_type="draft-mtp"))
    first, second = launch.attempts
    assert first.failure is not None
    assert first.failure.kind is FailureClass.MTP_CONTEXT
    assert first.failure.evidence.endswith("failed to create MTP context")
    assert second.spec.spec_type is None
    # The model drafts with its own head: the model file is what is remembered.
    assert (harness_build.key, str(dense)) in broken.snapshot()
    _serves(launch)


def test_an_out_of_memory_start_steps_one_rung_down(
        supervise: Supervise, fixture_set: modelgen.FixtureSet, llama_server_binary: Path,
        tmp_path: Path) -> None:
    launcher = make_oom_launcher(llama_server_binary, tmp_path / "oom", fail_first=1)
    runner = SubprocessRunner(launcher, tmp_path / "logs", ready_timeout_s=60)
    moe = fixture_set.model("moe")
    launch = supervise("moe", runner=runner).launch_spec(
        LaunchSpec(model=moe, ctx_size=1024, n_cpu_moe=1, n_gpu_layers=3))
    first, second = launch.attempts
    assert first.failure is not None
    assert first.failure.kind is FailureClass.OUT_OF_MEMORY
    assert first.failure.exit_code == OOM_EXIT_CODE
    assert "cudaMalloc failed: out of memory" in first.failure.evidence
    assert (first.rung.step, second.rung.step) == (Step.PLANNED, Step.ALL_EXPERTS_TO_CPU)
    assert (second.spec.cpu_moe, second.spec.n_cpu_moe) == (True, None)
    assert "--cpu-moe" in second.argv
    assert starts_seen(launcher) == 2
    _serves(launch)


def test_the_injected_start_is_the_real_event_then_the_real_binary(
        llama_server_binary: Path, fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    launcher = make_oom_launcher(llama_server_binary, tmp_path, fail_first=1)
    model = fixture_set.model("dense")
    injected = subprocess.run([str(launcher), "--model", str(model), "-lv", "4"],
                              capture_output=True, text=True, timeout=30, check=False)
    assert injected.returncode == OOM_EXIT_CODE
    lines = [line.split(" ", 2)[2] for line in injected.stderr.splitlines()]
    size = model.stat().st_size
    assert lines == [
        f"ggml_backend_cuda_buffer_type_alloc_buffer: allocating {size / 1024 / 1024:.2f} MiB "
        "on device 0: cudaMalloc failed: out of memory",
        f"ggml_backend_buft_alloc_buffer_n_default: failed to allocate CUDA0 buffer of size "
        f"{size}",
        "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
        "llama_model_load_from_file_impl: failed to load model",
        f"cmn  common_init_: failed to load model '{model}'",
        f"srv    load_model: failed to load model, '{model}'",
        "srv    operator(): operator(): cleaning up before exit...",
        "srv  llama_server: exiting due to model loading error",
    ]
    assert classify_start_failure(injected.returncode, injected.stderr, False).kind is (
        FailureClass.OUT_OF_MEMORY)
    real = subprocess.run([str(llama_server_binary), "--version"], capture_output=True,
                          text=True, timeout=30, check=False)
    passed = subprocess.run([str(launcher), "--version"], capture_output=True, text=True,
                            timeout=30, check=False)
    assert (passed.returncode, passed.stdout, passed.stderr) == (
        real.returncode, real.stdout, real.stderr)
    assert starts_seen(launcher) == 2


def _fails(supervisor: LaunchSupervisor[SubprocessServer], spec: LaunchSpec,
           kind: FailureClass) -> LaunchFailedError:
    with pytest.raises(LaunchFailedError) as raised:
        supervisor.launch_spec(spec)
    error = raised.value
    assert error.failure.kind is kind, str(error)
    assert len(error.attempts) == 1
    assert error.attempts[0].failure == error.failure
    assert error.attempts[0].action.startswith("gave up:")
    assert error.attempts[0].outcome is AttemptOutcome.GAVE_UP
    assert "is not a failure a retry can fix" in error.reason
    assert str(error.failure) in str(error)
    return error


def test_an_unknown_flag_is_not_retried(supervise: Supervise,
                                        fixture_set: modelgen.FixtureSet) -> None:
    error = _fails(supervise("dense"), LaunchSpec(
        model=fixture_set.model("dense"), extra_args=("--no-such-flag",)),
        FailureClass.UNKNOWN_FLAG)
    assert error.failure.evidence == "error: invalid argument: --no-such-flag"
    assert error.failure.exit_code == 1


def test_a_file_that_is_no_gguf_is_a_model_load_failure(
        supervise: Supervise, tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model\n", encoding="utf-8")
    error = _fails(supervise("dense"), LaunchSpec(model=text), FailureClass.MODEL_LOAD)
    assert "failed to load model" in error.failure.evidence


def test_a_real_abort_with_an_mtp_head_blames_the_head_before_the_build(
        supervise: Supervise, fixture_set: modelgen.FixtureSet, tmp_path: Path,
        harness_build: BuildUnderTest) -> None:
    # glm4moe without its nextn tensors aborts in the MTP context (a GGML_ASSERT); the
    # same model serves without speculation, so the head is what the retry leaves out.
    headless = _without_nextn(fixture_set.model("mtp"), tmp_path / "mtp-headless.gguf")
    broken = BrokenDrafters()
    launch = supervise("mtp", broken=broken).launch_spec(
        LaunchSpec(model=headless, ctx_size=512, parallel=1, spec_type="draft-mtp"))
    first, second = launch.attempts
    assert first.failure is not None
    assert first.failure.kind is FailureClass.CRASH
    assert first.failure.exit_code == -signal.SIGABRT
    assert 'GGML_ASSERT(layer.nextn.eh_proj && "MTP block missing nextn.eh_proj") failed' in (
        first.failure.evidence)
    assert "blamed it before the build" in first.action
    assert second.outcome is AttemptOutcome.SERVED
    assert second.spec.spec_type is None
    assert broken.snapshot() == {(harness_build.key, str(headless))}
    _serves(launch)


def test_a_server_that_never_becomes_ready_times_out(
        supervise: Supervise, llama_server_binary: Path, tmp_path: Path) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)
    runner = SubprocessRunner(llama_server_binary, tmp_path / "logs", ready_timeout_s=3)
    supervisor = supervise("dense", runner=runner)
    error = _fails(supervisor, LaunchSpec(model=fifo, ctx_size=512),
                   FailureClass.READINESS_TIMEOUT)
    assert error.failure.exit_code is None
    assert "load_model" in error.attempts[0].log_text


def test_a_bad_flag_value_is_unknown(supervise: Supervise,
                                     fixture_set: modelgen.FixtureSet) -> None:
    error = _fails(supervise("dense"), LaunchSpec(model=fixture_set.model("dense"),
                                                  flash_attn="bogus"), FailureClass.UNKNOWN)
    assert error.failure.evidence.startswith('error while handling argument "--flash-attn"')


def _without_nextn(source: Path, target: Path) -> Path:
    """A copy of ``source`` with every ``nextn`` (MTP head) tensor left out."""
    reader = gguf.GGUFReader(source)
    arch = str(reader.fields[gguf.Keys.General.ARCHITECTURE].contents())
    writer = gguf.GGUFWriter(target, arch)
    for field in reader.fields.values():
        # GGUFWriter writes the architecture and the GGUF.* header fields itself.
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        value_type = field.types[0]
        sub_type = field.types[-1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), value_type, sub_type=sub_type)
    kept = [t for t in reader.tensors if ".nextn." not in t.name]
    assert len(kept) < len(reader.tensors), "the mtp fixture has no nextn tensors"
    for tensor in kept:
        writer.add_tensor_info(tensor.name, tensor.data.shape, tensor.data.dtype,
                               tensor.data.nbytes, tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor in kept:
        writer.write_tensor_data(tensor.data, tensor_endianess=reader.endianess)
    writer.close()
    return target


def test_the_supervisor_stops_at_its_attempt_bound(
        fixture_set: modelgen.FixtureSet, llama_server_binary: Path, tmp_path: Path,
        harness_build: BuildUnderTest) -> None:
    launcher = make_oom_launcher(llama_server_binary, tmp_path / "oom", fail_first=10)
    runner = SubprocessRunner(launcher, tmp_path / "logs", ready_timeout_s=60)
    moe = fixture_set.model("moe")
    supervisor = LaunchSupervisor(runner, harness_build.key, BrokenDrafters(),
                                  read_model_facts(moe), max_attempts=2)
    with pytest.raises(ServerError) as raised:
        supervisor.launch_spec(LaunchSpec(model=moe, ctx_size=4096, n_cpu_moe=1))
    assert isinstance(raised.value, LaunchFailedError)
    assert len(raised.value.attempts) == 2
    assert "gives up after 2" in raised.value.reason
    assert starts_seen(launcher) == 2


def test_a_launch_whose_start_hangs_ends_at_the_launch_deadline(
        fixture_set: modelgen.FixtureSet, llama_server_binary: Path, tmp_path: Path,
        harness_build: BuildUnderTest) -> None:
    fifo = tmp_path / "model.gguf"
    os.mkfifo(fifo)  # the load blocks reading it: a start that hangs
    runner = SubprocessRunner(llama_server_binary, tmp_path / "logs", ready_timeout_s=60,
                              stop_grace_s=1)
    supervisor = LaunchSupervisor(runner, harness_build.key, BrokenDrafters(),
                                  read_model_facts(fixture_set.model("dense")), deadline_s=2)
    started = time.monotonic()
    with pytest.raises(LaunchFailedError) as raised:
        supervisor.launch_spec(LaunchSpec(model=fifo, ctx_size=512))
    assert time.monotonic() - started < 2 + 1 + 10  # not the runner's 60 s
    error = raised.value
    assert error.failure.kind is FailureClass.READINESS_TIMEOUT
    assert "the launch's deadline ran out: its starts may take 2s together" in error.reason
    assert "load_model" in error.attempts[0].log_text


def test_a_launch_whose_starts_keep_failing_ends_at_the_launch_deadline(
        fixture_set: modelgen.FixtureSet, llama_server_binary: Path, tmp_path: Path,
        harness_build: BuildUnderTest) -> None:
    launcher = make_oom_launcher(llama_server_binary, tmp_path / "oom", fail_first=50)
    # Each start spends 0.4 s bringing its device up, then runs out of memory: the
    # ladder's four rungs take longer than the launch may.
    slow = tmp_path / "slow-device-start"
    slow.write_text(f'#!/bin/sh\nsleep 0.4\nexec {launcher} "$@"\n')
    slow.chmod(0o755)
    runner = SubprocessRunner(slow, tmp_path / "logs", ready_timeout_s=60)
    moe = fixture_set.model("moe")
    supervisor = LaunchSupervisor(runner, harness_build.key, BrokenDrafters(),
                                  read_model_facts(moe), deadline_s=1.0)
    with pytest.raises(LaunchFailedError) as raised:
        supervisor.launch_spec(LaunchSpec(model=moe, ctx_size=4096, n_cpu_moe=1))
    assert "the launch's deadline ran out" in raised.value.reason
    assert raised.value.attempts[-1].outcome is AttemptOutcome.GAVE_UP
    assert starts_seen(launcher) < 4  # the ladder was cut, not walked to its end
