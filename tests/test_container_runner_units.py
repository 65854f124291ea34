"""The container runner's pure helpers: exit statuses, mounts, absolute paths."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from harness.planning.launch import LaunchSpec
from harness.runners.container_runner import absolute_paths, spec_mounts
from harness.runners.driver_cache import (
    CACHE_VARIABLES,
    MOUNT_POINT,
    driver_cache_dir,
    driver_cache_environment,
)
from harness.runners.llama_server_container import status_from_docker


@pytest.mark.parametrize(("docker_status", "expected"), [
    (0, 0),
    (1, 1),
    (128, 128),  # not a signal: 128 + 0
    (128 + signal.SIGKILL, -signal.SIGKILL),
    (128 + signal.SIGSEGV, -signal.SIGSEGV),
    (128 + signal.SIGTERM, -signal.SIGTERM),
    (128 + int(signal.SIGRTMAX), -int(signal.SIGRTMAX)),
    (255, 255),  # beyond any signal number
])
def test_docker_signal_statuses_become_negative_signals(docker_status: int,
                                                        expected: int) -> None:
    assert status_from_docker(docker_status) == expected


def test_every_path_the_spec_names_is_mounted_once(tmp_path: Path) -> None:
    model, drafter, lora = (tmp_path / name for name in ("m.gguf", "d.gguf", "l.gguf"))
    for path in (model, drafter, lora):
        path.write_bytes(b"GGUF")
    spec = LaunchSpec(model=model, drafter=drafter,
                      extra_args=("--lora", str(lora), "--model-alias", "x", "--lora",
                                  str(lora), "--slot-save-path", str(tmp_path)))
    # Folders are not mounted (a server writing there needs more than read-only).
    assert spec_mounts(spec) == [model, drafter, lora]


def test_a_missing_file_is_not_mounted(tmp_path: Path) -> None:
    # The server then says "failed to load model" itself, as outside a container.
    assert spec_mounts(LaunchSpec(model=tmp_path / "missing.gguf")) == []


def test_relative_paths_become_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    spec = absolute_paths(LaunchSpec(model=Path("m.gguf"), ctx_size=256))
    assert spec.model == tmp_path / "m.gguf"
    assert spec.ctx_size == 256
    assert spec_mounts(spec) == [tmp_path / "m.gguf"]
    unchanged = LaunchSpec(model=Path(os.sep, "abs.gguf"))
    assert absolute_paths(unchanged) is unchanged


@pytest.mark.parametrize(("environ", "expected"), [
    ({"HARNESS_CACHE": "/c"}, Path("/c/driver-cache")),
    ({"HARNESS_CACHE": "/c", "HARNESS_DRIVER_CACHE": ""}, Path("/c/driver-cache")),
    ({"HARNESS_CACHE": "/c", "HARNESS_DRIVER_CACHE": " off "}, None),
    ({"HARNESS_DRIVER_CACHE": "OFF"}, None),
    ({"HARNESS_DRIVER_CACHE": "/kept/shaders"}, Path("/kept/shaders")),
])
def test_the_driver_cache_folder_follows_its_variable(environ: dict[str, str],
                                                       expected: Path | None) -> None:
    assert driver_cache_dir(environ) == expected


def test_a_relative_driver_cache_is_made_absolute(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # Docker mounts host paths: a relative one would name a volume instead.
    monkeypatch.chdir(tmp_path)
    assert driver_cache_dir({"HARNESS_DRIVER_CACHE": "shaders"}) == tmp_path / "shaders"


def test_every_driver_cache_variable_points_into_the_mount() -> None:
    env = driver_cache_environment()
    assert set(env) == set(CACHE_VARIABLES)
    assert len(set(env.values())) == len(env)
    assert all(value.startswith(MOUNT_POINT + "/") for value in env.values())
