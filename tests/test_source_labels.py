"""A run names its build's commit only when the checkout still holds the files built."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest
from llama_history import git

from harness.builds.native import build_server
from harness.builds.source import local_source
from harness.planning.build_plan import BuildRequest
from harness.plugin.recording.source_labels import COMMIT_LABEL, SUBJECT_LABEL, source_labels

FAKE_TREE = Path(__file__).parent / "data" / "fake-llama"

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def test_a_clean_checkout_names_its_commit_and_a_changed_one_does_not(tmp_path: Path) -> None:
    tree = tmp_path / "llama.cpp"
    shutil.copytree(FAKE_TREE, tree)
    git(tree, "init", "-q", "-b", "main")
    git(tree, "add", "-A")
    git(tree, "commit", "-q", "-m", "server: the one built")
    head = git(tree, "rev-parse", "HEAD")
    info = build_server(tmp_path / "cache", local_source(tree), BuildRequest(), jobs=1).info
    assert source_labels(info) == {COMMIT_LABEL: head, SUBJECT_LABEL: "server: the one built"}
    # Changed since: no commit names the files that were built.
    server = tree / "tools" / "server" / "server.c"
    server.write_text(server.read_text() + "\n/* later */\n")
    assert source_labels(info) == {}
    # Committed: clean again, but the files are not the ones built.
    git(tree, "commit", "-q", "-am", "later")
    assert source_labels(info) == {}
    # A tree harness bisect exported names its commit in its origin; the pin none.
    exported = dataclasses.replace(info, source_origin=f"git:{head}")
    assert source_labels(exported) == {COMMIT_LABEL: head}
    assert source_labels(dataclasses.replace(info, source_origin="pypi:x==1")) == {}
    assert source_labels(None) == {}
