"""What a bisect's builds cost on this machine: a cold build, a neighbour build with
ccache, and a whole ``harness bisect`` over a 9-commit history (issue 25).

    .venv/bin/python benchmarks/bisect_builds.py [--work DIR]

Builds go to a fresh cache under ``--work`` (its own ccache folder, so the cold build is
cold); only the pinned source comes from the harness cache. The histories are written
from the pinned tree by tests/llama_history.py, which the tests use too.

1. cold: the pinned tree, every object compiled (ccache empty).
2. neighbour: the next commit, one server source file changed (a comment in
   tools/server/server-context.cpp), built beside the first: what a probe next to an
   earlier one costs. Target on 2 cores: at most 90 s.
3. bisect: ``harness bisect --script`` over pin, docs, a server change, docs, the
   ``--ubatch-size`` rename (the culprit), a server change, docs x3: endpoints and
   probes, each a cache miss compiled with the ccache of steps 1 and 2.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the history writer

from llama_history import (
    RENAMED_OPTION,
    UBATCH_OPTION,
    append,
    edit,
    git,
    write_history,
)

from harness.builds.native import build_server
from harness.builds.source import SourceTree, hash_tree
from harness.planning.build_plan import BuildRequest

SERVER_FILE = "tools/server/server-context.cpp"


def _exported(tree: Path, sha: str, into: Path) -> SourceTree:
    into.mkdir(parents=True)
    archive = into.with_suffix(".tar")
    git(tree, "archive", "--format=tar", f"--output={archive}", sha)
    subprocess.run(["tar", "-xf", str(archive), "-C", str(into)], check=True)
    return SourceTree(path=into, digest=hash_tree(into), origin=f"git:{sha}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, default=None)
    work = (parser.parse_args().work or Path(tempfile.mkdtemp(prefix="bisect-bench-"))).absolute()
    cache = work / "cache"
    os.environ["HARNESS_CACHE"] = str(cache)
    os.environ.pop("CCACHE_DIR", None)
    history = write_history(work / "history", [
        ("docs: one", append("docs/build.md", "One.")),
        ("server: a comment", append(SERVER_FILE, "// a comment")),
        ("docs: two", append("docs/build.md", "Two.")),
        ("common: rename --ubatch-size", edit("common/arg.cpp", UBATCH_OPTION, RENAMED_OPTION)),
        ("server: another comment", append(SERVER_FILE, "// another comment")),
        ("docs: three", append("docs/build.md", "Three.")),
        ("docs: four", append("docs/build.md", "Four.")),
        ("docs: five", append("docs/build.md", "Five.")),
    ])
    figures: dict[str, float] = {}
    for name, index in (("cold build (ccache empty)", 1), ("neighbour build, one server file "
                                                           "changed (ccache)", 2)):
        source = _exported(history.tree, history.shas[index], work / f"tree-{index}")
        started = time.monotonic()
        built = build_server(cache, source, BuildRequest())
        assert not built.cache_hit
        figures[name] = time.monotonic() - started
        print(f"{name}: {figures[name]:.0f} s", flush=True)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "from harness.commands import main; main()",
                           "bisect", "--source", str(history.tree), "--good", history.shas[0],
                           "--bad", "master", "--out", str(work / "out"), "--json",
                           "--script",
                           '"$HARNESS_BISECT_BINARY" --help | grep -q -- --ubatch-size'],
                          capture_output=True, text=True, check=False)
    whole = time.monotonic() - started
    print(done.stderr, file=sys.stderr)
    result = json.loads(done.stdout)
    culprit = history.shas[history.index("common: rename")]
    print(f"whole bisect over {len(history.shas)} commits: {whole:.0f} s, "
          f"{len(result['probes'])} probes, exit {done.returncode}, first bad "
          f"{'PASS' if (result['first_bad'] or {}).get('sha') == culprit else 'FAIL'}")
    for probe in result["probes"]:
        print(f"  {probe['commit'][:12]} {probe['verdict']:<4} build "
              f"{'hit' if probe['cache_hit'] else format(probe['build_s'], '.0f') + ' s'}, "
              f"judge {probe['judge_s']:.1f} s  {probe['subject']}")


if __name__ == "__main__":
    main()
