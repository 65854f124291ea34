"""A llama-server that computes wrong numbers: the pinned source plus four kinds of error.

The numerics checks need a candidate that is wrong for a known reason and by a chosen
amount, in more than one place: a check can see one kind of error and be blind to
another, and the smallest amount it sees is its sensitivity. ``patches/miscompute.patch``
adds each kind as a one-line error in the CPU backend, behind its own variable
(``MISCOMPUTE_KINDS``) read once when first used; one build serves every kind and
amount, and with none set the binary computes exactly like the pinned build (each error
is a multiplication by a factor that is then exactly 1). The build request is the default
CPU one, so the patch is the only difference to the pinned build.

Every amount is in parts per million: the value the kind distorts is multiplied by
``1 + amount/1e6`` (``HARNESS_WRONG_NORM=500``: the RMS norm's scale x 1.0005). Per mille
would be too coarse: on the bench fixture 1 per mille of the norm, RoPE or attention
scale already moves a top-5 log-prob by 0.016-0.046. This is for the harness's own tests
only, never a build under test.
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

PATCH_PATH = Path(__file__).with_name("patches") / "miscompute.patch"
#: Every file the patch touches. quants.c is the x86 file: the default CPU build is
#: GGML_NATIVE=OFF with AVX2 on, so ggml_vec_dot_q4_0_q8_0 is its AVX2 loop.
PATCHED_FILES = (Path("ggml/src/ggml-cpu/ops.cpp"), Path("ggml/src/ggml-cpu/arch/x86/quants.c"))
#: Where the patched trees go, under the harness cache.
SOURCE_FOLDER = "miscompute-source"
#: Seconds one run of ``patch`` may take (well under one here).
PATCH_LIMIT_S = 120.0
#: Seconds a caller waits for another process making the patched tree: a copy of the
#: pinned tree and the patch, a minute at most on a slow disk.
MISCOMPUTE_LOCK_WAIT_S = 300.0
#: The largest amount accepted: x 11. Far past anything a check needs (the errors are
#: meant to be slight), and far below amounts that turn a norm or a softmax into inf.
MAX_AMOUNT = 10_000_000


@dataclass(frozen=True)
class MiscomputeKind:
    """One kind of wrong number the miscompute build carries: its variable, the unit its
    amount is in, and the line it changes (``where``)."""

    name: str
    env: str
    unit: str
    where: str


_PPM = "parts per million"
MISCOMPUTE_KINDS = (
    MiscomputeKind("norm", "HARNESS_WRONG_NORM",
                   f"{_PPM} added to the RMS norm's scale (500: x 1.0005)",
                   "ops.cpp, ggml_compute_forward_rms_norm_f32: scale = 1/sqrt(mean + eps)"),
    MiscomputeKind("rope", "HARNESS_WRONG_ROPE",
                   f"{_PPM} added to RoPE's frequency scale: position p rotates as "
                   "p x (1 + amount/1e6)",
                   "ops.cpp, ggml_compute_forward_rope_flt: freq_scale from the op params"),
    MiscomputeKind("attn-scale", "HARNESS_WRONG_ATTN_SCALE",
                   f"{_PPM} added to the attention softmax scale (1/sqrt(d))",
                   "ops.cpp: the scale op param of both flash-attention kernels "
                   "(ggml_compute_forward_flash_attn_ext_f16_one_chunk and _tiled) and of "
                   "ggml_compute_forward_soft_max_f32 when it has a mask (-fa off)"),
    MiscomputeKind("q4-dot", "HARNESS_WRONG_Q4_DOT",
                   f"{_PPM} added to the scale of the last Q4_0 block of each row",
                   "arch/x86/quants.c, ggml_vec_dot_q4_0_q8_0's AVX2 loop. With the "
                   "default repacking (AVX2) it only reaches Q4_0 matrices whose row "
                   "count is not a multiple of 8 (on bench-q4_0: the output projection, "
                   "269 rows); --no-repack sends every Q4_0 matrix through it"),
)
MISCOMPUTE_BY_NAME = {kind.name: kind for kind in MISCOMPUTE_KINDS}
#: Roughly the smallest amount (ppm) that moved a top-5 log-prob by more than 0.01 on
#: the greedy 32 tokens of one prompt (-c 512 -np 1 -t 1), measured by hand against the
#: pinned build: norm ~60, rope ~150-200, attn-scale ~400 (~1500 with -fa off) on bench;
#: q4-dot ~3300 on bench-q4_0 (linear: only the output projection). Any amount at all,
#: even 1, moves bench by ~0.005 (values in the f16 KV cache round the other way), and
#: bench-q4_0 with --no-repack by ~0.15 (Q8_0-quantized activations flip and cascade).


def apply_patch(tree: Path, patch: Path = PATCH_PATH) -> None:
    """Apply ``patch`` to the llama.cpp tree at ``tree`` in place, exactly or not at all."""
    patched.apply_patch(tree, patch, files=PATCHED_FILES,
                        needed_by="the miscompute build", limit_s=PATCH_LIMIT_S,
                        setting="harness.builds.miscompute.PATCH_LIMIT_S")


def miscompute_source(cache: Path) -> Path:
    """The pinned tree with the patch applied, made once in ``cache/miscompute-source/``
    (named by the pin's digest and the patch's hash: :func:`patched.patched_source`)."""
    return patched.patched_source(
        cache, PATCH_PATH, SOURCE_FOLDER, apply=apply_patch,
        lock_wait_s=MISCOMPUTE_LOCK_WAIT_S,
        lock_setting="harness.builds.miscompute.MISCOMPUTE_LOCK_WAIT_S")


def ensure_miscompute_build(cache: Path,
                            progress: ProgressCallback | None = None) -> BuildResult:
    """The CPU build of the miscompute source, built into the build cache if missing."""
    return ensure_build(cache, BuildRequest(), source=miscompute_source(cache),
                        progress=progress)


def miscompute_env(kind: str | MiscomputeKind, amount: int,
                   base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with ``kind`` set to ``amount``
    (parts per million) and every other kind unset, so exactly one error is on (0: none,
    the pinned build's numbers)."""
    if isinstance(kind, str):
        if kind not in MISCOMPUTE_BY_NAME:
            raise ConfigError(f"no miscompute kind {kind!r}; the kinds are "
                              + ", ".join(MISCOMPUTE_BY_NAME))
        kind = MISCOMPUTE_BY_NAME[kind]
    # bool is an int to Python, but True as an amount is a mistake, not 1 ppm.
    if isinstance(amount, bool) or not isinstance(amount, int):
        raise ConfigError(f"a {kind.name} error of {amount!r} is not a whole number of "
                          f"{kind.unit}")
    if not 0 <= amount <= MAX_AMOUNT:
        raise ConfigError(f"a {kind.name} error of {amount} is outside 0..{MAX_AMOUNT}; "
                          f"the unit is {kind.unit}")
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in {other.env for other in MISCOMPUTE_KINDS}}
    env[kind.env] = str(amount)
    return env
