"""The pinned llama.cpp source with one of the harness's own patches applied.

The slowed build (``slowed.py``: slower for a known reason) and the miscompute build
(``miscompute.py``: wrong numbers for a known reason) are both the pinned tree plus a
patch, built like the pinned build, for the harness's benchmarks and tests only. What
they share lives here: applying a patch exactly or not at all, and making the patched
tree once per pin and patch under a lock, so that concurrent callers build one tree.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from harness.bounded import bounded_lock, run_step
from harness.builds.source import MANIFEST_PATH, fetch_pinned_source
from harness.errors import SourceError, ToolMissingError
from harness.files import sha256_file


def apply_patch(tree: Path, patch: Path, *, files: Sequence[Path], needed_by: str,
                limit_s: float, setting: str) -> None:
    """Apply ``patch`` to the llama.cpp tree at ``tree`` in place, exactly or not at all.

    ``files`` are the files the patch edits (named in the message when it does not apply),
    ``needed_by`` what needs it (for the message when GNU patch is missing), ``limit_s``
    the seconds one run of ``patch`` may take, set by the module constant ``setting``.
    """
    tool = shutil.which("patch")
    if tool is None:
        raise ToolMissingError(f"GNU patch is not installed; {needed_by} needs it: install "
                               "it with `apt-get install patch`")
    # Dry run first, so a patch that fails on its second hunk leaves the tree untouched.
    # --fuzz=0: a hunk that only lands by ignoring context means the source moved, and
    # the edit might then sit somewhere it no longer does what it is for.
    base = [tool, "--batch", "--forward", "--fuzz=0", "--no-backup-if-mismatch",
            "-p1", "-d", str(tree), "-i", str(patch)]
    for argv in ([*base, "--dry-run"], base):
        run = run_step(argv, step=f"patch -i {patch.name}", limit_s=limit_s,
                       setting=setting, error=SourceError)
        if run.code != 0:
            raise SourceError(
                f"{patch} does not apply to {tree} (patch exit {run.code}):\n"
                + "\n".join(run.tail).strip() + "\n"
                f"The pinned source ({MANIFEST_PATH.name}) probably changed: redo the edits "
                f"in {', '.join(map(str, files))} of the new source and regenerate "
                "the patch with diff -u."
            )


def patched_source(cache: Path, patch: Path, folder: str, *,
                   apply: Callable[[Path], None], lock_wait_s: float,
                   lock_setting: str) -> Path:
    """The pinned tree with ``patch`` applied (by ``apply``), made once in ``cache/folder/``.

    Named by the pin's digest and the patch's hash, so a new pin or an edited patch gets
    a tree of its own. Made in a temp directory beside it and renamed into place: a tree
    at the final path is always complete. A caller waits ``lock_wait_s`` at most (set by
    the module constant ``lock_setting``) for another process making the same tree.
    """
    pinned = fetch_pinned_source(cache)
    name = f"{pinned.digest[:16]}-{sha256_file(patch)[:12]}"
    home = cache / folder
    tree = home / name
    if tree.is_dir():
        return tree
    home.mkdir(parents=True, exist_ok=True)
    with bounded_lock(Path(str(tree) + ".lock"), wait_s=lock_wait_s,
                      purpose=f"making the patched source {folder}/{name}",
                      error=SourceError, setting=lock_setting):
        if tree.is_dir():
            return tree  # another process made it while this one waited
        staging = Path(tempfile.mkdtemp(dir=home, prefix=f".{name}-"))
        try:
            shutil.copytree(pinned.path, staging, symlinks=True, dirs_exist_ok=True)
            apply(staging)
            os.replace(staging, tree)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return tree
