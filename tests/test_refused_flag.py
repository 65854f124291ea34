"""A flag the launch sent and the server refused is the harness's bug; a plan needing a
feature the build lacks is never started.

The server is a stand-in that refuses the way common/arg.cpp does (``error: invalid
argument: --x`` on stderr, exit 1), so the supervisor's whole path runs without a build.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from harness.builds.capabilities import parse_capabilities
from harness.errors import UnsupportedByBuildError
from harness.facts.model_facts import ModelFacts
from harness.planning.drafter import BrokenDrafters
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.report.allure_meta import category_of
from harness.runners.subprocess_runner import SubprocessRunner, SubprocessServer
from harness.supervise.supervisor import LaunchFailedError, LaunchSupervisor
from harness.verdicts.failure import FailureClass, StartFailure, classify_start_failure
from harness.verdicts.refused_flag import refusal_verdict, refused_flag

HELP = (Path(__file__).parent / "data" / "help" / "llama-server-11434-cpu.txt").read_text()
MODEL = Path("/m/model.gguf")
FACTS = ModelFacts(path=str(MODEL), file_size=1 << 20, architecture="test", block_count=2,
                   context_length=4096, embedding_length=64, head_count=4,
                   head_count_kv=(2, 2), key_length=16, value_length=16, vocab_size=269)
REFUSED = classify_start_failure(1, "error: invalid argument: --n-cpu-ffn\n", timed_out=False)
HARNESS_BUG = "harness bug: the launch sent --n-cpu-ffn, which this build refuses"


def test_the_refused_flag_is_read_from_the_servers_words() -> None:
    assert REFUSED.kind is FailureClass.UNKNOWN_FLAG
    assert refused_flag(REFUSED) == "--n-cpu-ffn"
    older = classify_start_failure(1, "error: unknown argument: --n-cpu-ffn=2\n", False)
    assert refused_flag(older) == "--n-cpu-ffn"
    assert refused_flag(StartFailure(FailureClass.OUT_OF_MEMORY, "x")) is None


def test_a_refused_flag_a_field_wrote_is_a_harness_bug() -> None:
    verdict = refusal_verdict(REFUSED, LaunchSpec(model=MODEL, n_cpu_ffn=1))
    assert verdict is not None
    assert verdict.startswith(HARNESS_BUG)
    assert "harness/planning/build_support.py" in verdict


def test_a_refused_flag_added_by_hand_is_not() -> None:
    by_hand = LaunchSpec(model=MODEL, extra_args=("--n-cpu-ffn", "1"))
    assert refusal_verdict(REFUSED, by_hand) is None
    assert refusal_verdict(REFUSED, LaunchSpec(model=MODEL)) is None


@pytest.fixture
def refusing_runner(tmp_path: Path) -> SubprocessRunner:
    """A runner whose server refuses ``--n-cpu-ffn`` and counts its starts."""
    binary = tmp_path / "llama-server"
    binary.write_text(f"#!/bin/sh\necho started >> {tmp_path / 'starts'}\n"
                      "echo 'error: invalid argument: --n-cpu-ffn' >&2\nexit 1\n")
    binary.chmod(0o755)
    return SubprocessRunner(binary, tmp_path / "logs", ready_timeout_s=30)


def _starts(runner: SubprocessRunner, tmp_path: Path) -> int:
    marker = tmp_path / "starts"
    return len(marker.read_text().splitlines()) if marker.is_file() else 0


def _supervisor(runner: SubprocessRunner) -> LaunchSupervisor[SubprocessServer]:
    return LaunchSupervisor(runner, "cpu-old", BrokenDrafters(), FACTS)


def test_the_supervisor_names_a_refused_planned_flag_a_harness_bug(
        refusing_runner: SubprocessRunner, tmp_path: Path) -> None:
    with pytest.raises(LaunchFailedError) as raised:
        _supervisor(refusing_runner).launch_spec(LaunchSpec(model=MODEL, n_cpu_ffn=1))
    message = str(raised.value)
    assert raised.value.failure.kind is FailureClass.UNKNOWN_FLAG
    assert HARNESS_BUG in message
    assert category_of(f"harness.supervise.supervisor.LaunchFailedError: {message}", "",
                       "broken") == "Harness bug: a sent flag was refused"
    assert _starts(refusing_runner, tmp_path) == 1, "an unknown flag is not retried"


def test_a_hand_added_flag_stays_an_unknown_flag_start(
        refusing_runner: SubprocessRunner) -> None:
    spec = LaunchSpec(model=MODEL, extra_args=("--n-cpu-ffn", "1"))
    with pytest.raises(LaunchFailedError) as raised:
        _supervisor(refusing_runner).launch_spec(spec)
    message = str(raised.value)
    assert "harness bug" not in message
    assert category_of(message, "", "broken") == "Start failure: unknown-flag"


def test_a_plan_the_build_cannot_start_is_never_started(
        refusing_runner: SubprocessRunner, tmp_path: Path) -> None:
    plan = plan_launch(PlanRequest(
        model_path=MODEL, model=replace(FACTS, nextn_predict_layers=1),
        explicit_spec_type="draft-mtp",
        capabilities=replace(parse_capabilities(HELP), spec_types=("none", "draft-simple"))))
    assert plan.unsupported == ("--spec-type draft-mtp",)
    with pytest.raises(UnsupportedByBuildError,
                       match=r"^not supported by this build: --spec-type draft-mtp$"):
        _supervisor(refusing_runner).launch(plan)
    assert _starts(refusing_runner, tmp_path) == 0
