"""The ``harness`` command, run as a user runs it."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness import commands

HARNESS = [sys.executable, "-c", "from harness.commands import main; main()"]


def _harness(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*HARNESS, *args], capture_output=True, text=True, timeout=900,
                          env=env, check=False)


@pytest.mark.server
def test_second_build_is_a_cache_hit_that_runs_no_cmake(llama_server_binary: Path) -> None:
    if os.environ.get("HARNESS_SERVER_BIN") or os.environ.get("HARNESS_SOURCE"):
        pytest.skip("HARNESS_SERVER_BIN/HARNESS_SOURCE set: the pinned CPU build is not in use")
    log = llama_server_binary.parent.parent / "build.log"
    before = log.stat().st_mtime_ns
    result = _harness("build", "--backend", "cpu", "--rpc")  # the suites' build
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(llama_server_binary)
    assert "cache hit" in result.stderr
    assert log.stat().st_mtime_ns == before  # CMake did not run: the log was not rewritten


def test_fixtures_check_agrees_with_the_record() -> None:
    result = _harness("fixtures", "--check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "differs" not in result.stdout


def test_fixtures_lists_every_fixture(tmp_path: Path) -> None:
    result = _harness("fixtures", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines()}
    assert {"dense", "moe", "drafter", "mtp", "swa", "fused-dense", "fused-mtp"} <= names
    assert (tmp_path / "models" / "dense.gguf").is_file()


def test_a_bad_source_is_a_clear_error_not_a_traceback(tmp_path: Path) -> None:
    result = _harness("build", "--backend", "cpu", "--source", str(tmp_path))
    assert result.returncode == 2
    assert "is not a llama.cpp tree" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_unknown_backend_lists_the_choices() -> None:
    result = _harness("build", "--backend", "metal")
    assert result.returncode == 2
    assert "cpu" in result.stderr
    assert "vulkan" in result.stderr


def test_help_lists_one_command_per_module_of_the_commands_package() -> None:
    """``harness --help`` is built from harness/commands: every module there is a command,
    and nothing else is."""
    modules = commands.command_modules()
    assert {"run", "build", "base_image", "repro", "serve", "upload"} <= set(modules)
    assert not any(name.startswith("_") for name in modules)
    result = _harness("--help")
    assert result.returncode == 0, result.stderr
    listed = result.stdout.split("Commands:", 1)[1].split()
    shown = {word for word in listed if word.replace("-", "_") in modules}
    assert shown == {name.replace("_", "-") for name in modules}


def test_a_module_defining_no_command_of_its_name_is_refused(
        monkeypatch: pytest.MonkeyPatch) -> None:
    stray = types.ModuleType("harness.commands.stray")
    monkeypatch.setitem(sys.modules, "harness.commands.stray", stray)
    with pytest.raises(RuntimeError, match=r"defines 0 click commands named 'stray'"):
        commands.command_of("stray")
