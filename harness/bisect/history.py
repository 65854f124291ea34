"""The commits a bisect searches, read from a git tree, and each one as a source tree.

A commit becomes a build's source the way a user's checkout does, through ``git
archive``: the tree the commit names, nothing from the working copy. The export lives
under the harness cache (``source/git-<commit>-<random>``) only while it is built, then
is removed: a llama.cpp tree is about 180 MB, and a bisect that kept every probe's
export filled a runner's disk (474 of them, 42 GB, on the project's CI machine). The
finished build is what later runs reuse, found by the tree's digest, which is kept per
commit (``source/commit-digests/<commit>``, a line each: a commit's tree never changes)
so a commit built before is not exported again; ccache reads every tree at one relative
path (``builds/<key>/source``), so a commit next to one built before still recompiles
only the files that differ, wherever its export lay.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tarfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.builds.source import SourceTree, hash_tree
from harness.errors import ConfigError, SourceError
from harness.facts.commit_ids import short_commit
from harness.files import atomic_write_bytes

#: git's answers are local and quick; this bounds a wedged repository.
GIT_LIMIT_S = 120.0
_SHA = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}")
_DIGEST = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Commit:
    sha: str
    subject: str


def _git(tree: Path, *args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", str(tree), *args], capture_output=True,
                              text=True, timeout=GIT_LIMIT_S, check=False)
    except FileNotFoundError as exc:
        raise ConfigError("harness bisect needs git on PATH (apt-get install git)") from exc
    except subprocess.TimeoutExpired as exc:
        raise SourceError(f"git {' '.join(args)} in {tree} did not answer within "
                          f"{GIT_LIMIT_S:.0f} s") from exc
    if done.returncode != 0:
        raise SourceError(f"git {' '.join(args)} in {tree} failed: "
                          f"{done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def resolve(tree: Path, ref: str) -> Commit:
    """The commit ``ref`` names in ``tree`` (a branch, tag, sha or ``HEAD~3``)."""
    if ref.startswith("-"):
        raise ConfigError(f"{ref!r} is not a git ref")
    try:
        sha = _git(tree, "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}").strip()
    except SourceError as exc:
        raise ConfigError(f"{ref!r} names no commit in {tree}: give a branch, tag or "
                          "commit id of that repository") from exc
    return Commit(sha, subject(tree, sha))


def subject(tree: Path, sha: str) -> str:
    return _git(tree, "log", "-1", "--format=%s", sha).strip()


def commits_between(tree: Path, good: Commit, bad: Commit, *,
                    first_parent: bool = False) -> list[Commit]:
    """``good``, then every commit ``bad`` has that ``good`` lacks (``bad`` last): oldest
    first — the commits ``git bisect`` searches.

    ``good`` must be an ancestor of ``bad``. Merged side branches come in topological
    order (parents first), and the search walks them as a graph (:func:`parents_between`);
    a branch forked before ``good`` and merged after it is searched too, as git bisect
    does, since its commits reach ``bad`` only through the merge and one of them may be
    the culprit (its base, an ancestor of ``good``, counts as good). ``first_parent``
    keeps only the commits of ``bad``'s own line, so a fork that merges upstream is
    searched over its merges and blames the merge.
    """
    try:
        _git(tree, "merge-base", "--is-ancestor", good.sha, bad.sha)
    except SourceError as exc:
        raise ConfigError(f"the good commit {short_commit(good.sha)} is not an ancestor of "
                          f"the bad commit {short_commit(bad.sha)} in {tree}: a bisect "
                          "searches the commits from one to the other; swap them or pick "
                          "other endpoints") from exc
    walk = ["--first-parent"] if first_parent else []
    listed = _git(tree, "log", "--reverse", "--topo-order", "--format=%H%x00%s", *walk,
                  f"{good.sha}..{bad.sha}")
    middle = [Commit(*line.split("\0", 1)) for line in listed.splitlines() if line]
    if not middle or middle[-1].sha != bad.sha:
        how = " with --first-parent" if first_parent else ""
        raise ConfigError(f"git lists no path from {short_commit(good.sha)} to "
                          f"{short_commit(bad.sha)} in {tree}{how}")
    return [good, *middle]


def parents_between(tree: Path, good: Commit, bad: Commit) -> dict[str, tuple[str, ...]]:
    """Each commit's parents for the commits :func:`commits_between` lists without
    ``first_parent``: the graph the search walks where side branches were merged."""
    listed = _git(tree, "log", "--format=%H %P", f"{good.sha}..{bad.sha}")
    return {sha: tuple(parents) for sha, *parents in
            (line.split() for line in listed.splitlines() if line.strip())}


@contextmanager
def exported(tree: Path, commit: Commit, cache: Path) -> Iterator[SourceTree]:
    """``commit``'s tree exported (``git archive``) under the cache and hashed, for the
    length of the block; removed after it, whatever the block did. Each call exports its
    own copy, so two processes building the same commit never remove each other's."""
    home = cache / "source" / f"git-{commit.sha}-{uuid.uuid4().hex[:12]}"
    home.parent.mkdir(parents=True, exist_ok=True)
    try:
        _archive(tree, commit.sha, home)
        digest = hash_tree(home)
        memo = _digest_file(cache, commit)
        memo.parent.mkdir(exist_ok=True)
        atomic_write_bytes(memo, (digest + "\n").encode("ascii"))
        yield SourceTree(path=home, digest=digest, origin=f"git:{commit.sha}")
    finally:
        shutil.rmtree(home, ignore_errors=True)


def known_digest(cache: Path, commit: Commit) -> str | None:
    """The digest an earlier export of ``commit`` hashed to; None when none was made
    (or its line is unreadable: the commit is exported again)."""
    try:
        text = _digest_file(cache, commit).read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _DIGEST.fullmatch(text) else None


def _digest_file(cache: Path, commit: Commit) -> Path:
    if not _SHA.fullmatch(commit.sha):
        raise ValueError(f"{commit.sha!r} is not a commit id")
    return cache / "source" / "commit-digests" / commit.sha


def _archive(tree: Path, sha: str, home: Path) -> None:
    staging = home.with_name(f".{home.name}-{uuid.uuid4().hex}")
    staging.mkdir()
    archive = staging.with_suffix(".tar")
    try:
        _git(tree, "archive", "--format=tar", f"--output={archive}", sha)
        with tarfile.open(archive) as tar:
            # git's own archive of a commit: the data filter still refuses links out.
            tar.extractall(staging, filter="data")
        os.replace(staging, home)
    finally:
        archive.unlink(missing_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
