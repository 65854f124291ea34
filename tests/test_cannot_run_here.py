"""A real build made for an instruction set this CPU lacks, started for real.

The pinned source built with one more ggml instruction-set option this host's CPU does
not have (``-DGGML_AVX512=ON`` on an AVX2 machine): the compiler emits the instructions,
the kernel kills llama-server with SIGILL before it serves. The compiler cache makes the
build cheap: only ggml's CPU backend compiles again. The suites skip a test on it with
the instruction sets named (and fail under ``HARNESS_REQUIRE_FEATURES=1``); the launch
supervisor strikes the build three times and then quarantines it, starting nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.native import BuildResult
from harness.builds.resolve import ensure_build
from harness.errors import CannotRunHereError
from harness.planning.build_plan import BuildRequest
from harness.planning.drafter import BrokenDrafters
from harness.planning.launch import LaunchSpec
from harness.probes.gguf_facts import read_model_facts
from harness.runners.subprocess_runner import SubprocessRunner
from harness.supervise.cannot_run import host_flags
from harness.supervise.strikes import QUARANTINE_STRIKES, QuarantinedError, StrikeBook
from harness.supervise.supervisor import LaunchFailedError, LaunchSupervisor
from harness.verdicts.failure import FailureClass
from harness.verdicts.instruction_sets import GGML_ISA_FLAGS

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
SMOKE = "suites/test_smoke.py::test_fixture_serves[dense]"
#: The options tried, widest first: the first whose instructions this CPU lacks is built.
#: Only options whose code ggml runs without asking the CPU first: an AMX build checks for
#: AMX at run time and serves on a CPU without it (measured on an AVX-512 host without
#: AMX: the GGML_AMX_TILE build served the dense fixture), so it is no foreign build.
CANDIDATES = ("GGML_AVX512", "GGML_AVX512_BF16")


@pytest.fixture(scope="module")
def foreign_build(harness_cache: Path) -> tuple[BuildResult, str]:
    """The pinned source built for an instruction set this CPU lacks, and that set."""
    host = host_flags()
    option = next((o for o in CANDIDATES if GGML_ISA_FLAGS[o] not in host), None)
    if option is None:
        pytest.skip(f"this CPU has every instruction set tried ({', '.join(CANDIDATES)}): "
                    "no build for a missing one can be made here")
    return (ensure_build(harness_cache, BuildRequest(extra_cmake_args=(f"-D{option}=ON",))),
            GGML_ISA_FLAGS[option])


def _smoke(binary: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            "-n", "0", "--harness-build", str(binary), SMOKE]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_a_suite_skips_a_build_that_cannot_run_here_and_require_features_fails_it(
        foreign_build: tuple[BuildResult, str], fixture_set: modelgen.FixtureSet,
        harness_cache: Path) -> None:
    build, isa = foreign_build
    book = StrikeBook(harness_cache / "strikes")
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST", "HARNESS_REQUIRE"))}
    for required in (False, True):
        # Each run strikes the build once with this model: start every run from none.
        book.clear(build.info.key, fixture_set.model("dense"))
        run = _smoke(build.binary, {**env, "HARNESS_REQUIRE_FEATURES": "1"} if required
                     else env)
        output = run.stdout + run.stderr
        assert "cannot run on this host" in output, output[-3000:]
        assert f"the build asked for {isa}, which this CPU lacks" in output, output[-3000:]
        if required:
            assert run.returncode == 1, output[-3000:]
            assert "1 failed" in output
        else:
            assert run.returncode == 0, output[-3000:]
            assert "1 skipped" in output
    book.clear(build.info.key, fixture_set.model("dense"))


def test_the_supervisor_strikes_the_build_then_quarantines_it(
        foreign_build: tuple[BuildResult, str], fixture_set: modelgen.FixtureSet,
        tmp_path: Path) -> None:
    build, isa = foreign_build
    model = fixture_set.model("dense")
    book = StrikeBook(tmp_path / "strikes")
    logs = tmp_path / "logs"
    supervisor = LaunchSupervisor(SubprocessRunner(build.binary, logs, ready_timeout_s=120),
                                  build.info.key, BrokenDrafters(), read_model_facts(model),
                                  strikes=book, cmake_flags=build.info.cmake_flags)
    spec = LaunchSpec(model=model, ctx_size=512)
    for strike in range(1, QUARANTINE_STRIKES + 1):
        with pytest.raises(CannotRunHereError) as raised:
            supervisor.launch_spec(spec)
        assert isa in raised.value.features
        cause = raised.value.__cause__
        assert isinstance(cause, LaunchFailedError)
        assert cause.failure.kind is FailureClass.CANNOT_RUN_HERE
        assert cause.failure.exit_code in (-4, 132), cause.failure
        assert f"strike {strike}" in cause.reason
    started = sorted(logs.iterdir())
    with pytest.raises(QuarantinedError) as quarantined:
        supervisor.launch_spec(spec)
    assert str(quarantined.value).startswith(
        f"quarantined: build {build.info.key} crashed {QUARANTINE_STRIKES} starts in a row")
    assert "cannot-run-here (killed by signal 4)" in str(quarantined.value)
    assert sorted(logs.iterdir()) == started, "a quarantined build was started"
    # Lifting it is deleting the file the verdict names.
    book.path(build.info.key, model).unlink()
    with pytest.raises(CannotRunHereError):
        supervisor.launch_spec(spec)
