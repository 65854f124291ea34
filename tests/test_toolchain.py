"""Missing build tools are named together with the Debian package to install."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness.errors import ToolMissingError
from harness.facts.build import Backend
from harness.probes.toolchain import find_toolchain


def _path_with(tmp_path: Path, programs: list[str]) -> str:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    for program in programs:
        link = bindir / program
        link.write_text("#!/bin/sh\necho 'fake 1.0'\n")
        link.chmod(0o755)
    return str(bindir)


def test_missing_cmake_names_the_package(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["cc", "c++", "make"]))
    with pytest.raises(ToolMissingError, match=r"apt-get install cmake"):
        find_toolchain(Backend.CPU)


def test_missing_cxx_compiler_names_gxx(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["cmake", "cc", "make"]))
    with pytest.raises(ToolMissingError, match=r"apt-get install g\+\+"):
        find_toolchain(Backend.CPU)


def test_cuda_needs_nvcc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["cmake", "cc", "c++", "make"]))
    with pytest.raises(ToolMissingError, match="nvcc"):
        find_toolchain(Backend.CUDA)


def test_present_tools_are_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(tmp_path, ["cmake", "cc", "c++", "make"]))
    toolchain = find_toolchain(Backend.CPU)
    assert toolchain.generator == "Unix Makefiles"
    assert toolchain.compiler == "fake 1.0"
    assert os.path.basename(toolchain.cmake) == "cmake"
