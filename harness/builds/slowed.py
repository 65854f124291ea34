"""A deliberately slowed llama-server: the pinned source plus six kinds of slowdown.

The A/B gate's detection benchmark, its design calibration and their tests need a
candidate that is slower for a known reason and by a chosen amount, in more than one
way: a design can see one kind of change and be blind to another. ``patches/
slowdowns.patch`` adds each kind behind its own variable (``SLOWDOWNS``), read once when
the server starts; one build serves every kind and level, and with none set the binary
behaves like the pinned build. The build request is the default CPU one, so the patch is
the only difference to the pinned build.

This is for benchmarks and the harness's own tests only, never a build under test.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from harness.builds import patched
from harness.builds.native import BuildResult, ProgressCallback
from harness.builds.resolve import ensure_build
from harness.errors import ConfigError
from harness.planning.build_plan import BuildRequest

#: Microseconds the slowed server spins after each generated token; unset or 0: none.
SLOW_DECODE_ENV = "HARNESS_SLOW_DECODE_US"
PATCH_PATH = Path(__file__).with_name("patches") / "slowdowns.patch"
#: The line the patch adds for the decode wait; tests look for it in the patched file.
PATCH_MARKER = "// harness: decode slowdown for A/B detection benchmarks"
#: The server file with the decode loop, and every file the patch touches.
PATCHED_FILE = Path("tools/server/server-context.cpp")
PATCHED_FILES = (PATCHED_FILE, Path("tools/server/server.cpp"),
                 Path("ggml/src/ggml-cpu/ggml-cpu.c"))
#: Seconds one run of ``patch`` may take (well under one here).
PATCH_LIMIT_S = 120.0
#: Seconds a caller waits for another process making the slowed tree: a copy of the
#: pinned tree and the patch, a minute at most on a slow disk.
SLOWED_LOCK_WAIT_S = 300.0


@dataclass(frozen=True)
class SlowdownKind:
    """One kind of slowdown the slowed build carries: its variable, the unit its amount
    is in, and the metric it is made to move (where in the source: ``where``)."""

    name: str
    env: str
    unit: str
    moves: str
    where: str


SLOWDOWNS = (
    SlowdownKind("decode-wait", SLOW_DECODE_ENV, "µs of busy wait per generated token",
                 "decode_tps", "server-context.cpp, after each sampled token but the first"),
    SlowdownKind("memory", "HARNESS_SLOW_MEMORY_MIB", "MiB written per generated token "
                 "(one write per cache line)", "decode_tps",
                 "server-context.cpp, beside the decode wait"),
    SlowdownKind("matmul", "HARNESS_SLOW_MATMUL_ITERS", "dependent multiply-adds per "
                 "thread per matrix multiply", "decode_tps",
                 "ggml-cpu.c, ggml_compute_forward_mul_mat (prompt batches too)"),
    SlowdownKind("prompt", "HARNESS_SLOW_PROMPT_US", "µs of busy wait per prompt token",
                 "prompt_tps", "server-context.cpp, before a prompt batch's timing ends"),
    SlowdownKind("first-token", "HARNESS_SLOW_FIRST_TOKEN_US", "µs of busy wait before a "
                 "request's prompt starts", "ttft_ms",
                 "server-context.cpp, before the slot's prompt timing starts (the "
                 "prompt batch after it is slower too: ggml's threads went idle)"),
    SlowdownKind("threads", "HARNESS_SLOW_THREADS", "threads the server uses, whatever "
                 "--threads says", "decode_tps", "server.cpp, after the arguments are parsed"),
)
SLOWDOWN_BY_NAME = {kind.name: kind for kind in SLOWDOWNS}


def apply_patch(tree: Path, patch: Path = PATCH_PATH) -> None:
    """Apply ``patch`` to the llama.cpp tree at ``tree`` in place, exactly or not at all."""
    # PATCH_LIMIT_S is read at call time, so a test (or a slow disk) can change it here.
    patched.apply_patch(tree, patch, files=PATCHED_FILES,
                        needed_by="the slowed benchmark build", limit_s=PATCH_LIMIT_S,
                        setting="harness.builds.slowed.PATCH_LIMIT_S")


def slowed_source(cache: Path) -> Path:
    """The pinned tree with the patch applied, made once in ``cache/slowed-source/``
    (named by the pin's digest and the patch's hash: :func:`patched.patched_source`)."""
    return patched.patched_source(cache, PATCH_PATH, "slowed-source", apply=apply_patch,
                                  lock_wait_s=SLOWED_LOCK_WAIT_S,
                                  lock_setting="harness.builds.slowed.SLOWED_LOCK_WAIT_S")


def ensure_slowed_build(cache: Path, progress: ProgressCallback | None = None) -> BuildResult:
    """The CPU build of the slowed source, built into the build cache if missing."""
    return ensure_build(cache, BuildRequest(), source=slowed_source(cache), progress=progress)


def wait_for_slowdown(fraction: float, baseline_decode_tps: float) -> int:
    """Microseconds per token that make decode ``fraction`` slower than the baseline.

    A token takes t = 1/tps; ``fraction`` slower in tokens/s means t/(1 - fraction) per
    token, so the wait is the difference, t * fraction / (1 - fraction).
    """
    if not 0.0 <= fraction < 1.0:
        raise ConfigError(f"a decode slowdown of {fraction!r} is not a fraction in [0, 1); "
                          "give e.g. 0.1 for 10 % slower")
    if baseline_decode_tps <= 0.0:
        raise ConfigError(f"baseline decode speed {baseline_decode_tps!r} tokens/s must be "
                          "positive; measure the baseline build first")
    token_us = 1e6 / baseline_decode_tps
    return round(token_us / (1.0 - fraction) - token_us)


def slowdown_of_wait(wait_us: float, baseline_decode_tps: float) -> float:
    """The fraction by which a wait of ``wait_us`` per token slows a decode of
    ``baseline_decode_tps`` (the inverse of :func:`wait_for_slowdown`).

    The wait is wall time, not work: it does not speed up or slow down with the machine,
    so the same wait is a larger fraction of a faster decode. A token that took t takes
    t + wait, and the speed falls by wait / (t + wait).
    """
    if wait_us < 0.0 or baseline_decode_tps <= 0.0:
        raise ConfigError(f"cannot size a wait of {wait_us!r} µs at {baseline_decode_tps!r} "
                          "tokens/s: the wait must be >= 0 and the speed positive")
    extra = wait_us * baseline_decode_tps / 1e6
    return extra / (1.0 + extra)


def slowed_env(wait_us: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the slowed server's wait set."""
    return slowdown_env(SLOWDOWN_BY_NAME["decode-wait"], wait_us, base)


def slowdown_env(kind: SlowdownKind, amount: int,
                 base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``kind`` set to ``amount`` and
    every other kind unset, so exactly one slowdown is on."""
    if amount < 0:
        raise ConfigError(f"a {kind.name} slowdown of {amount} {kind.unit} is below 0")
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in {other.env for other in SLOWDOWNS}}
    env[kind.env] = str(amount)
    return env
