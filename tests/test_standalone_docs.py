"""The project stands on its own: nothing it holds points outside the repository.

The design and the measured facts live in ``docs/design.md``, the runtimes the planners
port behaviour from in ``docs/references.md`` (one ``## Reference 00N: ...`` section
each). A clone has nothing else, so no tracked file may cite the steering checkout's
design file or reference excerpts, every file that cites a reference by number also says
where it is described, every number cited has its section, and every link into the two
pages lands on a heading that exists.

Files are read as text (bytes that are not UTF-8 ignored); the forbidden words are built
from parts so this file does not hold them.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

from checkout import REPO_ROOT

DESIGN_PAGE = REPO_ROOT / "docs" / "design.md"
REFERENCES_PAGE = REPO_ROOT / "docs" / "references.md"
#: Folders that are never the project's own files (made here, or by a tool).
SKIPPED_PARTS = {".git", ".venv", "node_modules", "__pycache__"}
#: Where the out-of-repo material lived, in the words a citation of it used.
_SHARED = "shared" + "/"
OUT_OF_REPO = re.compile("|".join((
    re.escape("../" + _SHARED),
    re.escape(_SHARED + "DE" "SIGN"),
    re.escape(_SHARED + "reference"),
    # The steering checkout's design file by its upper-case name, bare or with ".md" or
    # "'s"; not the A/B designs' names in code (the tuple of all designs, a metavar).
    r"\b" + "DE" "SIGN" + r"\b(?![=_])",
)))
#: "reference 002", "References 002 and 003", "seed 004", "reference/001", "references 000/001".
CITATION = re.compile(r"\b(?:references?|seeds?)[ /]+(0\d\d)\b", re.IGNORECASE)
#: A reference's section heading in docs/references.md.
SECTION = re.compile(r"^## Reference (0\d\d): \S", re.MULTILINE)
HEADING = re.compile(r"^#{1,6} +(.+?) *#* *$", re.MULTILINE)
LINK = re.compile(r"\]\(([^)\s]+)(?:\s[^)]*)?\)")


def _tracked() -> list[Path]:
    """The repository's files: git's list, or a walk where this is no git checkout."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others",
                                 "--exclude-standard"], cwd=REPO_ROOT, capture_output=True,
                                check=True).stdout.decode().split("\0")
        paths = [REPO_ROOT / name for name in listed if name]
    except (OSError, subprocess.CalledProcessError):
        paths = [p for p in REPO_ROOT.rglob("*")
                 if not SKIPPED_PARTS & set(p.relative_to(REPO_ROOT).parts)]
    return sorted(p for p in paths if p.is_file())


def _texts() -> Iterator[tuple[str, str]]:
    for path in _tracked():
        yield (str(path.relative_to(REPO_ROOT)),
               path.read_bytes().decode("utf-8", errors="ignore"))


def github_anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation and backticks dropped
    (hyphens and underscores kept), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(markdown: str) -> set[str]:
    """Every heading's anchor; a repeated one gets ``-1``, ``-2``, ... as on GitHub."""
    found: set[str] = set()
    counts: dict[str, int] = {}
    body = re.sub(r"^```.*?^```", "", markdown, flags=re.MULTILINE | re.DOTALL)
    for heading in HEADING.findall(body):
        base = github_anchor(heading)
        count = counts.get(base, 0)
        counts[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def test_the_helpers_read_citations_and_anchors() -> None:
    assert github_anchor("Reference 002: drafter handling, crash strikes and GPU-unused "
                         "detection") == ("reference-002-drafter-handling-crash-strikes-and-"
                                          "gpu-unused-detection")
    assert github_anchor("The `harness tune` command") == "the-harness-tune-command"
    assert anchors("# A\n## B c\n```\n# not a heading\n```\n## B c\n") == {"a", "b-c", "b-c-1"}
    sample = "(reference 001's table), References 002 and 003, seed 004, references 000/001"
    assert CITATION.findall(sample) == ["001", "002", "004", "000"]
    assert OUT_OF_REPO.search("see " + "DE" "SIGN" + ".md")
    assert OUT_OF_REPO.search("(" + "DE" "SIGN" + ")")
    assert not OUT_OF_REPO.search('metavar="' + "DE" "SIGN" + '=N", AB_' + "DE" "SIGNS")
    assert not OUT_OF_REPO.search("docs/design.md and the design card")


def test_the_two_pages_are_there() -> None:
    for page in (DESIGN_PAGE, REFERENCES_PAGE):
        assert page.is_file(), f"{page.relative_to(REPO_ROOT)} is missing"


def test_no_tracked_file_points_outside_the_repository() -> None:
    found = [f"{name}:{text.count(chr(10), 0, match.start()) + 1}: {match.group(0)}"
             for name, text in _texts() for match in OUT_OF_REPO.finditer(text)]
    assert not found, (
        "files citing material outside the repository (cite docs/design.md or "
        "docs/references.md instead): " + "; ".join(found))


def test_every_cited_reference_has_a_section() -> None:
    sections = set(SECTION.findall(REFERENCES_PAGE.read_text(encoding="utf-8")))
    assert sections >= {"000", "001", "002", "003", "004"}, sections
    missing = sorted({f"{number} (in {name})" for name, text in _texts()
                      for number in CITATION.findall(text) if number not in sections})
    assert not missing, f"references cited without a section in docs/references.md: {missing}"


def test_every_file_citing_a_reference_says_where_it_is_described() -> None:
    page = str(REFERENCES_PAGE.relative_to(REPO_ROOT))
    unexplained = [name for name, text in _texts()
                   if name != page and CITATION.search(text) and "references.md" not in text]
    assert not unexplained, (
        f"files that cite 'reference 00N' but never name docs/references.md: {unexplained}")


def test_every_link_into_the_two_pages_finds_its_heading() -> None:
    targets = {page.resolve(): anchors(page.read_text(encoding="utf-8"))
               for page in (DESIGN_PAGE, REFERENCES_PAGE)}
    broken = []
    for name, text in _texts():
        if not name.endswith(".md"):
            continue
        for target in LINK.findall(text):
            path, _, anchor = target.partition("#")
            if not anchor or re.match(r"[a-z][a-z0-9+.-]*:", path):
                continue
            here = REPO_ROOT / name
            page = (here.parent / path if path else here).resolve()
            if page in targets and anchor not in targets[page]:
                broken.append(f"{name}: {target}")
    assert not broken, f"links to headings that do not exist: {broken}"
