"""Git histories written from the pinned llama.cpp source, for bisects on real builds.

Each history starts with the pinned tree exactly (so its first commit's build is the
pinned build, a cache hit wherever the suites ran) and adds the commits a test needs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.builds.source import fetch_pinned_source
from harness.paths import cache_root

#: Where the pinned server declares ``--ubatch-size`` (common/arg.cpp).
UBATCH_OPTION = '{"-ub", "--ubatch-size"}'
#: The same option under a name the plan does not know: the server no longer offers
#: ``--ubatch-size``, as a release that dropped or renamed it would.
RENAMED_OPTION = '{"-ub", "--micro-batch-size"}'


@dataclass(frozen=True)
class History:
    tree: Path
    #: Commit ids, oldest first.
    shas: tuple[str, ...]
    subjects: tuple[str, ...]

    def index(self, subject_start: str) -> int:
        return next(i for i, s in enumerate(self.subjects) if s.startswith(subject_start))


#: Fixed commit dates: a history written again has the same commit ids, so a bisect over
#: it finds each commit's build from the digest kept by the last run (no export).
COMMIT_DATE = "2026-01-01T00:00:00+00:00"


def git(tree: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "harness", "GIT_AUTHOR_EMAIL": "harness@localhost",
           "GIT_COMMITTER_NAME": "harness", "GIT_COMMITTER_EMAIL": "harness@localhost",
           "GIT_AUTHOR_DATE": COMMIT_DATE, "GIT_COMMITTER_DATE": COMMIT_DATE}
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


Change = Callable[[Path], None]


def write_history(where: Path, changes: list[tuple[str, Change]]) -> History:
    """The pinned tree as the first commit, then one commit per (subject, change)."""
    tree = where / "llama.cpp"
    shutil.copytree(fetch_pinned_source(cache_root()).path, tree, symlinks=True)
    git(tree, "init", "-q", "-b", "master")
    steps: list[tuple[str, Change]] = [("the pinned source", lambda _: None), *changes]
    shas, subjects = [], []
    for subject, change in steps:
        change(tree)
        # -f: the sdist holds files its own .gitignore names; the first commit must be
        # the pinned tree to the byte, or its build is not the pinned build.
        git(tree, "add", "-f", "-A")
        git(tree, "commit", "-q", "--allow-empty", "-m", subject)
        shas.append(git(tree, "rev-parse", "HEAD"))
        subjects.append(subject)
    return History(tree, tuple(shas), tuple(subjects))


def edit(relative: str, old: str, new: str) -> Change:
    def change(tree: Path) -> None:
        path = tree / relative
        text = path.read_text()
        assert old in text, f"{relative} no longer holds {old!r}: update tests/llama_history.py"
        path.write_text(text.replace(old, new, 1))
    return change


def append(relative: str, line: str) -> Change:
    def change(tree: Path) -> None:
        with (tree / relative).open("a") as out:
            out.write(line + "\n")
    return change


def flag_history(where: Path) -> History:
    """Docs, a broken build, its fix, ``--ubatch-size`` renamed (the culprit), docs."""
    server_cmake = "tools/server/CMakeLists.txt"
    return write_history(where, [
        ("docs: a note", append("docs/build.md", "A note.")),
        ("server: a change that breaks the configure step",
         append(server_cmake, 'message(FATAL_ERROR "broken on purpose")')),
        ("server: the configure step fixed",
         edit(server_cmake, 'message(FATAL_ERROR "broken on purpose")\n', "")),
        ("common: rename --ubatch-size", edit("common/arg.cpp", UBATCH_OPTION, RENAMED_OPTION)),
        ("docs: another note", append("docs/build.md", "Another note.")),
    ])


#: The slowed build's decode wait (harness/builds/patches/slowdowns.patch) reads its
#: microseconds from the environment; the slowing commit makes its default this, so the
#: commit is slower with nothing set: about a fifth of decode on the bench fixture here
#: (a token takes ~10 ms). At 200 µs (~12 %) a probe identical to the good build read
#: 1.078 [1.017, 1.159] against the bad one after 40 pairs in a noisy run: faster, but
#: not by the 3 % threshold with its whole interval, so undecided; the test is about
#: the search, and a wider gap lets the sequential design decide each side in a round.
DECODE_WAIT_US = 400
_WAIT_READ = ('std::getenv("HARNESS_SLOW_DECODE_US");\n'
              '                    const long us = value ? std::strtol(value, nullptr, 10) : 0;')


def _slow_decode(tree: Path) -> None:
    from harness.builds.slowed import PATCHED_FILE, apply_patch  # noqa: PLC0415

    apply_patch(tree)
    edit(str(PATCHED_FILE), _WAIT_READ,
         _WAIT_READ.replace(": 0;", f": {DECODE_WAIT_US};"))(tree)


def slow_history(where: Path) -> History:
    """Two docs commits, a broken configure step (the first probe), its fix, a decode
    wait (the culprit), two docs commits: eight commits."""
    server_cmake = "tools/server/CMakeLists.txt"
    return write_history(where, [
        ("docs: one", append("docs/build.md", "One.")),
        ("docs: two", append("docs/build.md", "Two.")),
        ("server: a change that breaks the configure step",
         append(server_cmake, 'message(FATAL_ERROR "broken on purpose")')),
        ("server: the configure step fixed",
         edit(server_cmake, 'message(FATAL_ERROR "broken on purpose")\n', "")),
        ("server: a wait after each token", _slow_decode),
        ("docs: three", append("docs/build.md", "Three.")),
        ("docs: four", append("docs/build.md", "Four.")),
    ])


#: Where ggml's CPU RoPE reads its frequency scale (ggml/src/ggml-cpu/ops.cpp, the pinned
#: tree: one line). The culprit scales every position by 1.002 right after it: a 0.2 %
#: error the numerics suite's bench probe fails on (docs/suites.md "Numerics").
ROPE_OPS = "ggml/src/ggml-cpu/ops.cpp"
_ROPE_READ = "    memcpy(&freq_scale,  (int32_t *) dst->op_params +  6, sizeof(float));\n"


def numerics_history(where: Path) -> History:
    """Two docs commits, RoPE's positions scaled by 1.002 (the culprit), a docs commit."""
    return write_history(where, [
        ("docs: one", append("docs/build.md", "One.")),
        ("docs: two", append("docs/build.md", "Two.")),
        ("ggml-cpu: rope frequency scale off by 0.2 %",
         edit(ROPE_OPS, _ROPE_READ, _ROPE_READ + "    freq_scale *= 1.002f;\n")),
        ("docs: three", append("docs/build.md", "Three.")),
    ])
