"""``harness bisect`` end to end over a real git history of a stand-in llama.cpp tree.

The tree (tests/data/fake-llama) builds in seconds through the real cached build path
and ccache; the history holds a commit that breaks the build and one that drops a flag
from ``--help``, and the oracle is a real shell script. What is under test is the
harness's control flow — endpoints first, the skip, the journal, the exit codes — not
llama-server, whose own bisects are in tests/test_bisect_real.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from results_fixtures import make_run

from harness.bisect.history import Commit, known_digest
from harness.bisect.journal import read_journal
from harness.bisect.search import Verdict
from harness.builds.source import SourceTree, hash_tree
from harness.commands.bisect import bisect_command
from harness.results.run_validation import parse_run_json

FAKE_TREE = Path(__file__).parent / "data" / "fake-llama"
FLAG_LINE = 'printf("-ub,   --ubatch-size N                   physical maximum batch size\\n");'
HARNESS = [sys.executable, "-c", "from harness.commands import main; main()"]
ORACLE = '"$HARNESS_BISECT_BINARY" --help | grep -q -- --ubatch-size'

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _git(tree: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@localhost",
           "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@localhost"}
    return subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True,
                          text=True, env=env).stdout.strip()


def _commit(tree: Path, subject: str) -> str:
    _git(tree, "add", "-A")
    _git(tree, "commit", "-q", "-m", subject)
    return _git(tree, "rev-parse", "HEAD")


def _flag_versions(server: Path) -> tuple[str, str]:
    """The stand-in server's source without and with ``--ubatch-size`` in its help."""
    original = server.read_text()
    with_flag = original.replace('        return 0;\n    }\n    return 1;',
                                 f'        {FLAG_LINE}\n        return 0;\n    }}\n    return 1;')
    assert with_flag != original
    return original, with_flag


def _base_with_flag(tree: Path) -> tuple[Path, str, str, str]:
    """The stand-in tree copied to ``tree`` as a new repository whose first commit's
    server lists ``--ubatch-size``: (its server.c, that source without the flag and with
    it, the first commit's id)."""
    shutil.copytree(FAKE_TREE, tree)
    server = tree / "tools" / "server" / "server.c"
    original, with_flag = _flag_versions(server)
    server.write_text(with_flag)
    _git(tree, "init", "-q", "-b", "main")
    return server, original, with_flag, _commit(tree, "base: the server lists --ubatch-size")


@pytest.fixture
def history(tmp_path: Path) -> tuple[Path, list[str]]:
    """base (good), docs, build broken, build fixed, flag dropped (the culprit), docs."""
    tree = tmp_path / "llama.cpp"
    server, original, with_flag, base = _base_with_flag(tree)
    shas = [base]
    (tree / "README.md").write_text("docs\n")
    shas.append(_commit(tree, "docs: a readme"))
    server.write_text(with_flag + "\nthis does not compile\n")
    shas.append(_commit(tree, "server: a change that breaks the build"))
    server.write_text(with_flag)
    shas.append(_commit(tree, "server: the build fixed"))
    server.write_text(original)
    shas.append(_commit(tree, "server: drop --ubatch-size"))
    (tree / "README.md").write_text("more docs\n")
    shas.append(_commit(tree, "docs: more"))
    return tree, shas


@pytest.fixture
def merged(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A main line that drops the flag, and a side branch that never did, merged.

    ``git log --reverse --topo-order`` lists main's two commits first, then the side
    branch's four: read as a line, a side commit probed good would clear main's culprit
    listed before it and the merge would be blamed."""
    tree = tmp_path / "merged"
    server, original, _, base = _base_with_flag(tree)
    shas = {"base": base}
    _git(tree, "checkout", "-q", "-b", "side")
    for number in (1, 2, 3, 4):
        (tree / "SIDE.md").write_text(f"side {number}\n")
        shas[f"side-{number}"] = _commit(tree, f"side: docs {number}")
    _git(tree, "checkout", "-q", "main")
    (tree / "MAIN.md").write_text("main\n")
    shas["main-1"] = _commit(tree, "main: docs")
    server.write_text(original)
    shas["culprit"] = _commit(tree, "main: drop --ubatch-size")
    _git(tree, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    (tree / "MAIN.md").write_text("after\n")
    shas["bad"] = _commit(tree, "main: docs after the merge")
    return tree, shas


def test_a_merged_side_branch_is_searched_as_a_graph(
        tmp_path: Path, merged: tuple[Path, dict[str, str]]) -> None:
    """A side commit judged good clears only its own ancestors, as in git bisect."""
    tree, shas = merged
    done = _bisect(tmp_path, tree, "--good", shas["base"], "--bad", "main", "--script",
                   ORACLE, "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["first_bad"]["sha"] == shas["culprit"]
    verdicts = {p["commit"]: p["verdict"] for p in result["probes"]}
    assert "good" in {verdicts.get(shas[f"side-{n}"]) for n in (1, 2, 3, 4)}


def test_a_side_branch_forked_before_good_is_searched_as_git_bisect_does(
        tmp_path: Path) -> None:
    """The culprit sits on a branch forked before the good commit and merged after it:
    git bisect searches that branch (its base counts as good) and names the culprit;
    walking only the good commit's descendants would have blamed the merge."""
    tree = tmp_path / "forked"
    server, original, _, _ = _base_with_flag(tree)
    _git(tree, "checkout", "-q", "-b", "side")
    (tree / "SIDE.md").write_text("side\n")
    _commit(tree, "side: docs")
    server.write_text(original)
    culprit = _commit(tree, "side: drop --ubatch-size")
    _git(tree, "checkout", "-q", "main")
    (tree / "MAIN.md").write_text("main\n")
    good = _commit(tree, "main: docs (the good endpoint)")
    (tree / "MAIN.md").write_text("main 2\n")
    _commit(tree, "main: more docs")
    _git(tree, "merge", "-q", "--no-ff", "-m", "merge side", "side")
    done = _bisect(tmp_path, tree, "--good", good, "--bad", "main", "--script", ORACLE,
                   "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["first_bad"]["sha"] == culprit
    # git's own bisect, judging the source for the same flag, names the same commit.
    _git(tree, "bisect", "start", "main", good)
    said = _git(tree, "bisect", "run", "grep", "-q", "--", "--ubatch-size",
                "tools/server/server.c")
    assert f"{culprit} is the first bad commit" in said


def test_a_release_bisect_goes_on_inside_the_first_bad_release(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Releases b9001..b9004 are tags of the stand-in tree; the flag is dropped by the
    middle one of three commits between b9002 and b9003. The release search names b9003,
    then the same command searches b9002..b9003 commit by commit and names the culprit.

    The package index is the one thing replaced: the releases it lists, and each
    release's tree exported from its tag (a real sdist fetch is
    tests/test_bisect_releases.py's, on real release builds)."""
    tree = tmp_path / "tagged"
    server, original, _, _ = _base_with_flag(tree)
    _git(tree, "tag", "b9001")
    (tree / "README.md").write_text("one\n")
    _commit(tree, "docs: one")
    _git(tree, "tag", "b9002")
    (tree / "README.md").write_text("two\n")
    _commit(tree, "docs: two")
    server.write_text(original)
    culprit = _commit(tree, "server: drop --ubatch-size")
    (tree / "README.md").write_text("three\n")
    _commit(tree, "docs: three")
    _git(tree, "tag", "b9003")
    (tree / "README.md").write_text("four\n")
    _commit(tree, "docs: four")
    _git(tree, "tag", "b9004")

    def release_tree(cache: Path, release: int) -> SourceTree:
        home = cache / "source" / f"release-{release}"
        if not home.is_dir():
            home.mkdir(parents=True)
            archive = subprocess.run(["git", "-C", str(tree), "archive", f"b{release}"],
                                     check=True, capture_output=True).stdout
            subprocess.run(["tar", "-x", "-C", str(home)], input=archive, check=True)
        return SourceTree(path=home, digest=hash_tree(home), origin=f"test:b{release}")

    monkeypatch.setenv("HARNESS_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("CCACHE_DIR", raising=False)
    monkeypatch.setattr("harness.commands.bisect.available_releases",
                        lambda: [9001, 9002, 9003, 9004])
    monkeypatch.setattr("harness.bisect.ranges.fetch_release", release_tree)
    done = CliRunner().invoke(bisect_command, [
        "--source", str(tree), "--good", "release:9001", "--bad", "release:9004",
        "--script", ORACLE, "--out", str(tmp_path / "out"), "--json"])
    assert done.exit_code == 0, done.output
    out = tmp_path / "out"
    releases = json.loads((out / "result.json").read_text())
    assert releases["first_bad"]["sha"] == "release:9003"
    assert "first bad release llama.cpp b9003" in done.output
    inside = json.loads((out / "result-git.json").read_text())
    assert inside["first_bad"]["sha"] == culprit
    # The second search ran from b9002's commit to b9003's, and only there.
    assert inside["good"] == _git(tree, "rev-parse", "b9002^{commit}")
    assert inside["bad"] == _git(tree, "rev-parse", "b9003^{commit}")
    assert inside["commits"] == 4
    # The release search probed releases only; the git one, commits inside b9003 only.
    assert {p["commit"] for p in releases["probes"]} <= {
        f"release:{n}" for n in (9001, 9002, 9003, 9004)}
    assert culprit in {p["commit"] for p in inside["probes"]}
    assert (out / "bisect-git.jsonl").is_file()


def _bisect(tmp_path: Path, tree: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HARNESS_CACHE": str(tmp_path / "cache")}
    env.pop("CCACHE_DIR", None)
    return subprocess.run([*HARNESS, "bisect", "--source", str(tree),
                           "--out", str(tmp_path / "out"), *args],
                          capture_output=True, text=True, env=env, timeout=600, check=False)


def test_a_bisect_skips_the_broken_build_and_names_the_commit_that_dropped_the_flag(
        tmp_path: Path, history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    run_json = tmp_path / "run.json"
    run_json.write_text(json.dumps(make_run("night-7").to_json()))
    done = _bisect(tmp_path, tree, "--good", shas[0], "--bad", "main", "--script", ORACLE,
                   "--json", "--record", str(run_json), "--allure-results",
                   str(tmp_path / "allure"))
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    # The run whose regression it explains carries it, through the run.json schema.
    assert parse_run_json(run_json.read_bytes()).bisect == result
    # ... and its Allure results hold it as one result, passed: it explains the regression.
    allure = [json.loads(f.read_text()) for f in (tmp_path / "allure").glob("*-result.json")]
    assert [(a["name"], a["status"]) for a in allure] == [("bisect", "passed")]
    assert allure[0]["statusDetails"]["message"].startswith(f"first bad commit: {shas[4]}")
    assert result["first_bad"] == {"sha": shas[4], "subject": "server: drop --ubatch-size"}
    said = {p["commit"]: p for p in result["probes"]}
    # Endpoints, the middle (its build is broken: skipped), its neighbour, the culprit.
    assert [p["commit"] for p in result["probes"]] == [shas[0], shas[2], shas[3], shas[4],
                                                        shas[5]]
    assert said[shas[2]]["verdict"] == "skip"
    assert said[shas[2]]["evidence"].startswith("build failed:")
    assert said[shas[2]]["build_key"] == ""
    assert said[shas[3]]["verdict"] == "good"
    assert said[shas[4]]["verdict"] == "bad"
    assert said[shas[4]]["evidence"] == "exit 1"
    # The progress lines came while it ran, and the table marks the culprit.
    assert done.stderr.count("probing ") == 5
    table = (tmp_path / "out" / "table.md").read_text()
    assert f"| {shas[4][:12]} **first bad** |" in table
    assert f"first bad commit: {shas[4]} server: drop --ubatch-size" in table
    # Each commit was exported by git archive into the cache, built from there, and its
    # export removed — the broken one's too: the builds are what later runs reuse.
    record = tmp_path / "cache" / "builds" / said[shas[4]]["build_key"] / "build.json"
    assert json.loads(record.read_text())["source_origin"] == f"git:{shas[4]}"
    assert list((tmp_path / "cache" / "source").glob("git-*")) == []
    # Each export's digest is kept per commit, so the next bisect over these commits finds
    # their builds without exporting them again: every built probe is a cache hit.
    memo = tmp_path / "cache" / "source" / "commit-digests" / shas[4]
    assert memo.read_text().strip() == json.loads(record.read_text())["source_digest"]
    again = _bisect(tmp_path, tree, "--good", shas[0], "--bad", "main", "--script", ORACLE,
                    "--json", "--out", str(tmp_path / "again"))
    assert again.returncode == 0, again.stderr
    probes = json.loads(again.stdout)["probes"]
    assert {p["commit"]: p["cache_hit"] for p in probes if p["verdict"] != "skip"} == {
        sha: True for sha in (shas[0], shas[3], shas[4], shas[5])}


def test_an_interrupted_bisect_resumes_from_its_journal_without_probing_again(
        tmp_path: Path, history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    first = _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[5], "--script", ORACLE,
                    "--max-builds", "2")
    assert first.returncode == 1, first.stderr
    assert "--max-builds 2 reached (2 compiled)" in first.stdout
    assert "the first bad commit is one of 5" in first.stdout
    journal = tmp_path / "out" / "bisect.jsonl"
    found = read_journal(journal)
    assert found is not None
    assert [p.commit for p in found[1]] == [shas[0], shas[5]]
    # A kill in the middle of a write leaves a torn line: dropped, not fatal.
    with journal.open("a") as torn:
        torn.write('{"commit": "')
    second = _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[5], "--script", ORACLE)
    assert second.returncode == 0, second.stderr
    found = read_journal(journal)
    assert found is not None
    commits = [p.commit for p in found[1]]
    assert len(commits) == len(set(commits)) == 5
    assert f"first bad commit: {shas[4]}" in second.stdout


def test_a_journal_of_another_bisect_is_refused(tmp_path: Path,
                                                history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    assert _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[5], "--script", ORACLE,
                   "--max-builds", "0").returncode == 1
    other = _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[5], "--script", "true")
    assert other.returncode == 2
    assert "is the journal of another bisect" in other.stderr
    assert "script: true" in other.stderr


def test_endpoints_that_do_not_reproduce_stop_before_any_search(
        tmp_path: Path, history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    done = _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[3], "--script", ORACLE,
                   "--json")
    assert done.returncode == 2
    result = json.loads(done.stdout)
    assert result["reproduced"] is False
    assert [p["commit"] for p in result["probes"]] == [shas[0], shas[3]]
    table = (tmp_path / "out" / "table.md").read_text()
    assert f"the bad endpoint {shas[3][:12]} judged good (exit 0)" in table


def test_a_script_can_skip_a_commit_with_125(tmp_path: Path,
                                            history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    skip_docs = (f'case "$HARNESS_BISECT_COMMIT" in {shas[3]}) exit 125;; esac; {ORACLE}')
    done = _bisect(tmp_path, tree, "--good", shas[1], "--bad", shas[5], "--script",
                   skip_docs, "--json")
    result = json.loads(done.stdout)
    said = {p["commit"]: p["verdict"] for p in result["probes"]}
    assert said[shas[3]] == Verdict.SKIP.value
    assert said[shas[2]] == Verdict.SKIP.value  # the broken build
    # Only skipped commits lie between the good docs commit and the culprit: the
    # candidates are listed, not guessed.
    assert done.returncode == 1
    assert [c["sha"] for c in result["candidates"]] == [shas[2], shas[3], shas[4]]


def test_endpoints_the_wrong_way_round_are_refused(tmp_path: Path,
                                                  history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    done = _bisect(tmp_path, tree, "--good", shas[5], "--bad", shas[0], "--script", ORACLE)
    assert done.returncode == 2
    assert "is not an ancestor of the bad commit" in done.stderr
    assert not (tmp_path / "cache" / "builds").exists()


def test_one_oracle_is_needed(tmp_path: Path, history: tuple[Path, list[str]]) -> None:
    tree, shas = history
    neither = _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[5])
    assert neither.returncode == 2
    assert "needs one oracle" in neither.stderr
    bad_test = _bisect(tmp_path, tree, "--good", shas[0], "--bad", shas[5], "--test",
                       "suites/../etc/passwd::x")
    assert bad_test.returncode == 2
    assert "names no suite test" in bad_test.stderr


def test_a_commit_digest_that_is_not_one_is_ignored(tmp_path: Path) -> None:
    """The per-commit digest is a cache file: anything but one hex digest in it means
    "export again", and only a commit id names such a file."""
    commit = Commit("a" * 40, "a commit")
    assert known_digest(tmp_path, commit) is None
    memo = tmp_path / "source" / "commit-digests" / commit.sha
    memo.parent.mkdir(parents=True)
    for text in ("", "not a digest\n", "f" * 63, "\xff" * 64):
        memo.write_text(text, encoding="latin-1")
        assert known_digest(tmp_path, commit) is None
    memo.write_text("0" * 64 + "\n")
    assert known_digest(tmp_path, commit) == "0" * 64
    with pytest.raises(ValueError, match="not a commit id"):
        known_digest(tmp_path, Commit("../../etc/passwd", "no"))
