"""The slowed build: its patch against the pinned source, the wait arithmetic, and that
the real slowed server is slower by about what it was asked for (and not otherwise)."""

from __future__ import annotations

import os
import shutil
import statistics
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.resolve import ensure_build
from harness.builds.slowed import (
    PATCH_MARKER,
    PATCH_PATH,
    PATCHED_FILE,
    SLOW_DECODE_ENV,
    apply_patch,
    ensure_slowed_build,
    slowed_env,
    wait_for_slowdown,
)
from harness.builds.source import fetch_pinned_source
from harness.errors import ConfigError, SourceError
from harness.perf.keys import DEFAULT_GEN_TOKENS, DEFAULT_PROMPT_TOKENS, DEFAULT_REPETITIONS
from harness.perf.measure import measure_speed
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners.subprocess_runner import SubprocessRunner


def _patched_paths() -> set[str]:
    lines = PATCH_PATH.read_text().splitlines()
    return {line.split()[1].removeprefix("b/") for line in lines if line.startswith("+++ ")}


def test_the_patch_touches_only_the_server_decode_loop_file() -> None:
    # The cheap test below copies only this file; a patch reaching further must say so.
    assert _patched_paths() == {str(PATCHED_FILE)}


def test_patch_applies_cleanly_to_the_pinned_source(harness_cache: Path,
                                                    tmp_path: Path) -> None:
    pinned = fetch_pinned_source(harness_cache)
    (tmp_path / PATCHED_FILE).parent.mkdir(parents=True)
    shutil.copy2(pinned.path / PATCHED_FILE, tmp_path / PATCHED_FILE)

    apply_patch(tmp_path)

    text = (tmp_path / PATCHED_FILE).read_text()
    assert text.count(PATCH_MARKER) == 1
    assert f'std::getenv("{SLOW_DECODE_ENV}")' in text
    assert "std::strtol(" in text
    assert "std::chrono::steady_clock::now()" in text
    # The spin sits after the decode loop's sampling and before the timestamp that ends
    # the generation time, so timings.predicted_per_second includes it.
    sample = text.index("id = common_sampler_sample(slot.smpl.get(), slot.ctx_tgt, tok_idx);")
    spin = text.index(PATCH_MARKER)
    stamp = text.index("slot.stats.update_gen_last();", spin)
    assert sample < spin < stamp
    assert (pinned.path / PATCHED_FILE).read_text().count(PATCH_MARKER) == 0


def test_a_patch_that_does_not_apply_names_it_and_leaves_the_tree_alone(
        tmp_path: Path) -> None:
    target = tmp_path / PATCHED_FILE
    target.parent.mkdir(parents=True)
    target.write_text("int main() { return 0; }\n")

    with pytest.raises(SourceError, match="does not apply") as error:
        apply_patch(tmp_path)

    assert str(PATCH_PATH) in str(error.value)
    assert "pinned source" in str(error.value)
    assert target.read_text() == "int main() { return 0; }\n"
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]


@pytest.mark.parametrize(("fraction", "tps", "wait_us"), [
    (0.0, 100.0, 0),
    (0.10, 100.0, 1111),  # 10 ms a token -> 11.111 ms
    (0.05, 100.0, 526),   # 10 ms -> 10.526 ms
    (0.50, 200.0, 5000),  # 5 ms -> 10 ms: half the tokens per second
])
def test_wait_for_slowdown(fraction: float, tps: float, wait_us: int) -> None:
    assert wait_for_slowdown(fraction, tps) == wait_us


def test_the_wait_gives_the_slowdown_it_was_asked_for() -> None:
    tps = 437.0
    for fraction in (0.01, 0.05, 0.1, 0.3):
        slowed_tps = 1e6 / (1e6 / tps + wait_for_slowdown(fraction, tps))
        assert 1 - slowed_tps / tps == pytest.approx(fraction, abs=1e-3)


@pytest.mark.parametrize(("fraction", "tps"), [(1.0, 100.0), (-0.1, 100.0), (0.1, 0.0)])
def test_wait_for_slowdown_refuses_nonsense(fraction: float, tps: float) -> None:
    with pytest.raises(ConfigError):
        wait_for_slowdown(fraction, tps)


def test_slowed_env_sets_only_the_wait() -> None:
    base = {"PATH": "/bin"}
    assert slowed_env(250, base) == {"PATH": "/bin", SLOW_DECODE_ENV: "250"}
    assert base == {"PATH": "/bin"}


def _decode_tps(runner: SubprocessRunner, model: Path) -> float:
    with runner.start(LaunchSpec(model=model, ctx_size=512)) as server:
        speed = measure_speed(server.base_url, DEFAULT_PROMPT_TOKENS, DEFAULT_GEN_TOKENS,
                              DEFAULT_REPETITIONS)
    assert speed.decode_tps is not None, f"{runner.binary} reported no decode speed"
    return speed.decode_tps


@pytest.mark.server
@pytest.mark.alone
# On a fresh cache the slowed build compiles first (about 5 minutes on 2 cores).
@pytest.mark.timeout(1800)
def test_the_slowed_server_is_slower_only_when_asked(harness_cache: Path,
                                                    fixture_set: modelgen.FixtureSet,
                                                    tmp_path: Path) -> None:
    pinned = ensure_build(harness_cache, BuildRequest()).binary
    slowed = ensure_slowed_build(harness_cache).binary
    model = fixture_set.model("bench")
    unset = {k: v for k, v in os.environ.items() if k != SLOW_DECODE_ENV}
    baseline_runner = SubprocessRunner(pinned, tmp_path, env=unset)
    wait = wait_for_slowdown(0.30, _decode_tps(baseline_runner, model))
    slow_runner = SubprocessRunner(slowed, tmp_path, env=slowed_env(wait, unset))
    idle_runner = SubprocessRunner(slowed, tmp_path, env=unset)

    baseline: list[float] = []
    slow: list[float] = []
    idle: list[float] = []
    for _ in range(3):  # alternating, so drift in the machine's speed hits every arm
        baseline.append(_decode_tps(baseline_runner, model))
        slow.append(_decode_tps(slow_runner, model))
        idle.append(_decode_tps(idle_runner, model))

    base = statistics.median(baseline)
    # Asked for 30 %; 15 % leaves room for noise (5-8 % run to run here).
    assert statistics.median(slow) <= 0.85 * base, (wait, baseline, slow)
    # Unset, the patch costs nothing beyond noise.
    assert statistics.median(idle) >= 0.75 * base, (baseline, idle)
