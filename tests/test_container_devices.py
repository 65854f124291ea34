"""Listing a container build's devices inside its image, and what a GPU gate does with it.

A container build's binary is ``/app/llama-server`` inside the image, so the host cannot
run ``--list-devices``; the plugin asks the server in the image instead. On this
machine the Vulkan image sees no device (llama.cpp skips the CPU-type llvmpipe), so a
run that demands Vulkan through the container runner must fail at session start with
the reasons, never skip its way to green.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import test_vulkan_container
from checkout import REPO_ROOT

from harness.errors import BuildError
from harness.probes.devices import list_devices_in_image
from harness.probes.docker_engine import docker_engine

pytestmark = [pytest.mark.docker, pytest.mark.server]


@pytest.fixture(scope="module")
def vulkan_build() -> tuple[str, str]:
    """(image, build key) of the pinned source's Vulkan image (a cache hit in CI)."""
    info = test_vulkan_container.vulkan_build()
    assert info.image is not None
    return info.image, info.key


def test_the_vulkan_image_lists_no_device_without_a_gpu(vulkan_build: tuple[str, str]) -> None:
    client = docker_engine()
    try:
        devices = list_devices_in_image(client, vulkan_build[0], None)
    finally:
        client.close()
    assert devices == ()


def test_a_missing_image_is_named(tmp_path: Path) -> None:
    client = docker_engine()
    try:
        with pytest.raises(BuildError, match="harness/llama-server:no-such"):
            list_devices_in_image(client, "harness/llama-server:no-such", None)
    finally:
        client.close()


def test_a_container_run_requiring_vulkan_fails_at_session_start(
        vulkan_build: tuple[str, str], tmp_path: Path) -> None:
    image, key = vulkan_build
    (tmp_path / "test_plain.py").write_text("def test_plain() -> None:\n    assert True\n")
    env = {name: value for name, value in os.environ.items()
           if not name.startswith(("PYTEST_", "HARNESS_RUN"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(tmp_path / "test_plain.py"), "-p", "no:xdist",
         "-p", "no:cacheprovider", "-o", "addopts=", "-q", f"--rootdir={tmp_path}",
         "--harness-runner", "container", "--harness-image", image,
         "--harness-build", key, "--harness-require-gpu", "vulkan"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 4, output
    assert "--harness-require-gpu=vulkan" in output
    assert "no usable vulkan GPU" in output or "shows no vulkan device" in output, output
    assert "1 passed" not in output
