"""A deliberately slowed llama-server: the pinned source plus a decode busy wait.

The A/B gate's detection benchmark and its end-to-end test need a candidate that is
slower for a known reason and by a chosen amount. ``patches/decode-busy-wait.patch``
adds a spin of ``HARNESS_SLOW_DECODE_US`` microseconds after each sampled token (but the
first) in the server's decode loop, inside what ``timings.predicted_per_second`` times,
so only decode speed drops. One build serves every slowdown: the wait is read from the
environment when the server starts, and with the variable unset the binary behaves like
the pinned build. The build request is the default CPU one, so the patch is the only
difference to the pinned build.

This is for benchmarks and the harness's own tests only, never a build under test.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from filelock import FileLock

from harness.builds.native import BuildResult, ProgressCallback
from harness.builds.resolve import ensure_build
from harness.builds.source import MANIFEST_PATH, fetch_pinned_source
from harness.errors import ConfigError, SourceError, ToolMissingError
from harness.files import sha256_file
from harness.planning.build_plan import BuildRequest

#: Microseconds the slowed server spins after each generated token; unset or 0: none.
SLOW_DECODE_ENV = "HARNESS_SLOW_DECODE_US"
PATCH_PATH = Path(__file__).with_name("patches") / "decode-busy-wait.patch"
#: The line the patch adds; tests look for it in the patched file.
PATCH_MARKER = "// harness: decode slowdown for A/B detection benchmarks"
PATCHED_FILE = Path("tools/server/server-context.cpp")


def apply_patch(tree: Path, patch: Path = PATCH_PATH) -> None:
    """Apply ``patch`` to the llama.cpp tree at ``tree`` in place, exactly or not at all."""
    tool = shutil.which("patch")
    if tool is None:
        raise ToolMissingError("GNU patch is not installed; the slowed benchmark build "
                               "needs it: install it with `apt-get install patch`")
    # Dry run first, so a patch that fails on its second hunk leaves the tree untouched.
    # --fuzz=0: a hunk that only lands by ignoring context means the source moved, and
    # the slowdown might then sit somewhere the decode timings do not cover.
    base = [tool, "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
            "-p1", "-d", str(tree), "-i", str(patch)]
    for argv in ([*base, "--dry-run"], base):
        proc = subprocess.run(argv, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SourceError(
                f"{patch} does not apply to {tree} (patch exit {proc.returncode}):\n"
                f"{(proc.stdout + proc.stderr).strip()}\n"
                f"The pinned source ({MANIFEST_PATH.name}) probably changed: redo the edit "
                f"in {PATCHED_FILE} of the new source and regenerate the patch with diff -u."
            )


def slowed_source(cache: Path) -> Path:
    """The pinned tree with the patch applied, made once in ``cache/slowed-source/``.

    Named by the pin's digest and the patch's hash, so a new pin or an edited patch gets
    a tree of its own. Made in a temp directory beside it and renamed into place: a tree
    at the final path is always complete.
    """
    pinned = fetch_pinned_source(cache)
    name = f"{pinned.digest[:16]}-{sha256_file(PATCH_PATH)[:12]}"
    home = cache / "slowed-source"
    tree = home / name
    if tree.is_dir():
        return tree
    home.mkdir(parents=True, exist_ok=True)
    with FileLock(str(tree) + ".lock"):
        if tree.is_dir():
            return tree  # another process made it while this one waited
        staging = Path(tempfile.mkdtemp(dir=home, prefix=f".{name}-"))
        try:
            shutil.copytree(pinned.path, staging, symlinks=True, dirs_exist_ok=True)
            apply_patch(staging)
            os.replace(staging, tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree


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


def slowed_env(wait_us: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """``base`` (default: this process's environment) with the slowed server's wait set."""
    env = dict(os.environ if base is None else base)
    env[SLOW_DECODE_ENV] = str(wait_us)
    return env
