"""What a bisect searches: commits of a git tree, or published releases.

A range lists its commits oldest first (the good endpoint first, the bad one last) and
turns one of them into a source tree to build. Git commits are exported with ``git
archive`` (harness/bisect/history.py); a published release is its sdist, fetched once by
version into the source cache (harness/releases/release_source.py), named
``release:<N>`` where a commit id would stand.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from harness.bisect.history import (
    Commit,
    commits_between,
    exported,
    known_digest,
    parents_between,
    resolve,
)
from harness.bisect.search import Parents
from harness.builds.source import SourceTree
from harness.errors import ConfigError
from harness.facts.commit_ids import RELEASE_PREFIX
from harness.planning.build_plan import BuildRequest
from harness.releases.published import PACKAGE, package_version, parse_release
from harness.releases.release_source import fetch_release, release_build_request

_RELEASE_ID = re.compile(r"release:([0-9]{1,9})")


class CommitRange(Protocol):
    @property
    def good(self) -> Commit: ...

    @property
    def bad(self) -> Commit: ...

    @property
    def first_parent(self) -> bool:
        """Only the bad commit's first-parent line (git; a release range has no merges)."""
        ...

    def describe(self) -> str:
        """Where the commits come from, in one line (the journal's header keeps it)."""
        ...

    def commits(self) -> list[Commit]: ...

    def parents(self) -> Parents:
        """Each commit's parents where the range is a graph; None where it is a line."""
        ...

    def source(self, commit: Commit, cache: Path) -> AbstractContextManager[SourceTree]:
        """``commit``'s source tree for the length of a ``with`` block (a git export is
        removed after it; a release's sdist stays in the source cache)."""
        ...

    def request(self, base: BuildRequest, source: SourceTree) -> BuildRequest:
        """The build of ``source``: the user's options, plus what the tree needs."""
        ...

    def known_digest(self, commit: Commit, cache: Path) -> str | None:
        """``commit``'s tree digest when known without fetching the tree, for a range
        whose build is the user's options whatever the tree (git); None: fetch it."""
        ...


@dataclass(frozen=True)
class GitRange:
    tree: Path
    good: Commit
    bad: Commit
    first_parent: bool = False

    def describe(self) -> str:
        return f"git {self.tree}" + (" --first-parent" if self.first_parent else "")

    def commits(self) -> list[Commit]:
        return commits_between(self.tree, self.good, self.bad, first_parent=self.first_parent)

    def parents(self) -> Parents:
        return None if self.first_parent else parents_between(self.tree, self.good, self.bad)

    def source(self, commit: Commit, cache: Path) -> AbstractContextManager[SourceTree]:
        return exported(self.tree, commit, cache)

    def request(self, base: BuildRequest, source: SourceTree) -> BuildRequest:
        return base

    def known_digest(self, commit: Commit, cache: Path) -> str | None:
        return known_digest(cache, commit)


def release_of(commit: Commit) -> int | None:
    """The release a ``release:<N>`` id names, None for a git commit (pure)."""
    found = _RELEASE_ID.fullmatch(commit.sha)
    return int(found.group(1)) if found else None


def release_commit(release: int) -> Commit:
    return Commit(f"{RELEASE_PREFIX}{release}",
                  f"llama.cpp b{release} ({PACKAGE} {package_version(release)})")


def parse_release_ref(ref: str) -> int | None:
    """``release:11300`` (or ``release:b11300``) as a release number; None for any other
    ref (a git ref); ConfigError for a release ref that names none."""
    if not ref.startswith(RELEASE_PREFIX):
        return None
    try:
        return parse_release(ref.removeprefix(RELEASE_PREFIX))
    except ValueError as exc:
        raise ConfigError(f"{ref!r}: {exc}; give release:NUMBER, e.g. release:11300") from exc


@dataclass(frozen=True)
class ReleaseRange:
    """The published releases from ``good`` to ``bad``, both included."""

    good: Commit
    bad: Commit
    #: Every release the index publishes (release_source.available_releases).
    available: tuple[int, ...]
    first_parent: bool = False

    @classmethod
    def between(cls, good: int, bad: int, available: list[int]) -> ReleaseRange:
        for release, side in ((good, "--good"), (bad, "--bad")):
            if release not in available:
                near = sorted(available, key=lambda r: abs(r - release))[:3]
                raise ConfigError(f"{side} release:{release} is not published as "
                                  f"{PACKAGE}; the nearest published: "
                                  + ", ".join(f"release:{r}" for r in sorted(near)))
        if good >= bad:
            raise ConfigError(f"the good release b{good} is not older than the bad release "
                              f"b{bad}: a bisect searches from the older to the newer")
        return cls(release_commit(good), release_commit(bad), tuple(available))

    def describe(self) -> str:
        return f"published releases of {PACKAGE}"

    def commits(self) -> list[Commit]:
        first, last = release_of(self.good) or 0, release_of(self.bad) or 0
        return [release_commit(r) for r in sorted(self.available) if first <= r <= last]

    def parents(self) -> Parents:
        return None  # releases follow one another

    def source(self, commit: Commit, cache: Path) -> AbstractContextManager[SourceTree]:
        release = release_of(commit)
        assert release is not None
        return nullcontext(fetch_release(cache, release))

    def request(self, base: BuildRequest, source: SourceTree) -> BuildRequest:
        # Older trees need their web UI switched off (their sdists lack its files).
        needed = release_build_request(source.path).extra_cmake_args
        return replace(base, extra_cmake_args=(*base.extra_cmake_args, *needed))

    def known_digest(self, commit: Commit, cache: Path) -> str | None:
        return None  # the build depends on the tree; its sdist stays in the cache anyway


def release_tag(tree: Path, release: Commit) -> Commit:
    """The commit of ``tree`` tagged as ``release`` (``release:11300`` is tag b11300)."""
    number = release_of(release)
    if number is None:
        raise ValueError(f"{release.sha} is not a release")
    try:
        return resolve(tree, f"b{number}")
    except ConfigError as exc:
        raise ConfigError(f"{tree} has no tag b{number} for {release.subject}: fetch "
                          "llama.cpp's tags (git fetch --tags) to go on inside the first "
                          "bad release, or run without --source") from exc


def inside_release(tree: Path, releases: Sequence[Commit], first_bad: int,
                   first_parent: bool) -> GitRange:
    """The commits of ``tree`` that make the release at ``releases[first_bad]``: from
    the tag of the release before it (the last good one) to its own tag."""
    if first_bad < 1:
        raise ValueError("the first bad release has no release before it")
    return GitRange(tree, release_tag(tree, releases[first_bad - 1]),
                    release_tag(tree, releases[first_bad]), first_parent)
