"""Which git commit a run's build came from, for the run record's labels.

A build from a llama.cpp checkout (``harness build --source``) is keyed by its files'
content, not by a commit. When that checkout is still at a clean commit whose files
are the ones built (same content digest), the run names the commit and its subject:
``source.commit`` and ``source.subject``, what a nightly needs to bisect between two
runs. A tree exported by ``harness bisect`` names its commit in its origin.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from harness.builds.source import hash_tree
from harness.errors import HarnessError
from harness.facts.build import BuildInfo

COMMIT_LABEL = "source.commit"
SUBJECT_LABEL = "source.subject"
_GIT_LIMIT_S = 10.0


def _git(tree: Path, *args: str) -> str | None:
    try:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True,
                              text=True, timeout=_GIT_LIMIT_S, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout if done.returncode == 0 else None


def source_labels(info: BuildInfo | None) -> dict[str, str]:
    """``source.commit`` (and ``source.subject``) of the build's tree, or nothing."""
    if info is None:
        return {}
    origin = info.source_origin
    if origin.startswith("git:"):
        return {COMMIT_LABEL: origin.removeprefix("git:")}
    if not origin.startswith("local:"):
        return {}
    tree = Path(origin.removeprefix("local:"))
    head = _git(tree, "rev-parse", "--verify", "HEAD^{commit}")
    status = _git(tree, "status", "--porcelain", "--untracked-files=no")
    if head is None or status is None or status.strip():
        return {}  # not a git checkout, or one with changes: no commit names these files
    try:
        if hash_tree(tree) != info.source_digest:
            return {}  # the checkout moved on since the build
    except (OSError, HarnessError):
        return {}
    subject = _git(tree, "log", "-1", "--format=%s", "HEAD") or ""
    return {COMMIT_LABEL: head.strip(), SUBJECT_LABEL: subject.strip()[:1024]}
