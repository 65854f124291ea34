"""Which compiler cache a native build uses, and what CMake and ccache are told (pure),
and the source link every cached build configures through."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.builds.compiler_cache import (
    CCACHE_ENV,
    CompilerCache,
    compiler_cache,
    linked_source,
)
from harness.errors import ConfigError
from harness.facts.build import Backend


def _program(folder: Path, name: str = "ccache") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    program = folder / name
    program.write_text("#!/bin/sh\nexec \"$@\"\n")
    program.chmod(0o755)
    return program


def test_auto_takes_the_ccache_on_path(tmp_path: Path) -> None:
    program = _program(tmp_path / "bin")
    found = compiler_cache(tmp_path / "cache", {"PATH": str(tmp_path / "bin")})
    assert found == CompilerCache(program=str(program), directory=tmp_path / "cache" / "ccache",
                                  base_dir=tmp_path / "cache")


@pytest.mark.parametrize("setting", ["", "auto"])
def test_auto_without_a_ccache_builds_without_one(tmp_path: Path, setting: str) -> None:
    assert compiler_cache(tmp_path, {"PATH": str(tmp_path / "empty"), CCACHE_ENV: setting}) \
        is None


@pytest.mark.parametrize("setting", ["0", "off", "OFF", "no", "false"])
def test_off_means_no_cache_even_with_ccache_on_path(tmp_path: Path, setting: str) -> None:
    _program(tmp_path / "bin")
    assert compiler_cache(tmp_path, {"PATH": str(tmp_path / "bin"), CCACHE_ENV: setting}) \
        is None


def test_a_named_program_is_used_and_a_missing_one_is_an_error_with_the_fix(
        tmp_path: Path) -> None:
    program = _program(tmp_path / "opt", "my-ccache")
    found = compiler_cache(tmp_path, {"PATH": "", CCACHE_ENV: str(program)})
    assert found is not None
    assert found.program == str(program)
    with pytest.raises(ConfigError) as info:
        compiler_cache(tmp_path, {"PATH": "", CCACHE_ENV: "/nowhere/ccache"})
    assert "/nowhere/ccache" in str(info.value)
    assert f"{CCACHE_ENV}=0" in str(info.value)
    assert "apt-get install ccache" in str(info.value)


def test_every_language_of_the_backend_gets_the_launcher() -> None:
    cache = CompilerCache(program="/usr/bin/ccache", directory=Path("/c/ccache"),
                          base_dir=Path("/c"))
    assert cache.cmake_flags(Backend.CPU) == (
        "-DCMAKE_C_COMPILER_LAUNCHER=/usr/bin/ccache",
        "-DCMAKE_CXX_COMPILER_LAUNCHER=/usr/bin/ccache")
    assert "-DCMAKE_CUDA_COMPILER_LAUNCHER=/usr/bin/ccache" in cache.cmake_flags(Backend.CUDA)


def test_the_environment_keeps_a_users_ccache_dir_and_makes_paths_relative() -> None:
    cache = CompilerCache(program="ccache", directory=Path("/c/ccache"), base_dir=Path("/c"))
    env = cache.environment({"PATH": "/bin"})
    assert env == {"PATH": "/bin", "CCACHE_DIR": "/c/ccache", "CCACHE_BASEDIR": "/c",
                   "CCACHE_NOHASHDIR": "1"}
    assert cache.environment({"CCACHE_DIR": "/mine"})["CCACHE_DIR"] == "/mine"


def test_the_source_link_is_made_kept_and_repointed(tmp_path: Path) -> None:
    build, first, second = tmp_path / "build", tmp_path / "one", tmp_path / "two"
    for folder in (build, first, second):
        folder.mkdir()
    link = linked_source(build, first)
    assert link == build / "source"
    assert link.resolve() == first
    before = os.lstat(link).st_mtime_ns
    assert linked_source(build, first) == link
    assert os.lstat(link).st_mtime_ns == before  # the same target: left as it is
    assert linked_source(build, second).resolve() == second


def test_a_folder_where_the_link_goes_is_replaced(tmp_path: Path) -> None:
    build, source = tmp_path / "build", tmp_path / "src"
    (build / "source" / "stale").mkdir(parents=True)
    source.mkdir()
    assert linked_source(build, source).resolve() == source
