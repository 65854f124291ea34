"""Container builds through the Docker SDK, on the stand-in tree that compiles in seconds.

Real Docker, real CMake and compiler inside the image (Debian packages from the host's
mirror over host networking); only the source is the tiny fake, so the cache hit, the
labels and the failure report are tested without a long build.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.builds.container_build import (
    BUILD_LABEL,
    build_image,
    image_backend,
    list_images,
    resolve_bases,
)
from harness.builds.source import local_source
from harness.errors import BuildError
from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest
from harness.probes.docker_engine import docker_engine

pytestmark = pytest.mark.docker

FAKE_TREE = Path(__file__).parent / "data" / "fake-llama"


@pytest.fixture
def client() -> Iterator[Any]:
    engine = docker_engine()
    yield engine
    engine.close()


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "llama.cpp"
    shutil.copytree(FAKE_TREE, tree)
    (tree / "tools" / "server" / "marker.txt").write_text(str(tmp_path))  # a unique digest
    return tree


def test_an_image_is_built_labelled_recorded_and_then_a_cache_hit(
        client: Any, fake_tree: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = local_source(fake_tree)
    built = build_image(client, cache, source, BuildRequest())
    try:
        assert not built.cache_hit
        info = built.info
        assert info.image is not None
        assert info.image.startswith("harness/llama-server:cpu-")
        assert info.version == "version: 0.0.0-fake (build 0, commit fake)"
        assert info.capabilities.spec_types == ("none", "draft-simple")
        assert info.source_digest == source.digest
        label = json.loads(client.images.get(info.image).labels[BUILD_LABEL])
        assert label["key"] == info.key
        assert (built.directory / "build.json").is_file()
        assert (built.directory / "build.log").read_text().count("cmake") > 0
        assert info.key in {listed.key for listed in list_images(client)}
        assert image_backend(client, info.image) is Backend.CPU
        again = build_image(client, cache, source, BuildRequest())
        assert again.cache_hit
        assert again.info == info
    finally:
        client.images.remove(built.info.image, force=True)


def test_a_failed_image_build_reports_the_log_tail_and_path(
        client: Any, fake_tree: Path, tmp_path: Path) -> None:
    request = BuildRequest(extra_cmake_args=("-DFAKE_FAIL=in-the-image",))
    with pytest.raises(BuildError) as failure:
        build_image(client, tmp_path / "cache", local_source(fake_tree), request)
    text = str(failure.value)
    assert "fake configure failure requested: in-the-image" in text
    assert "last 40 lines of the build log" in text
    assert Path(text.rsplit("full log: ", 1)[1].split(" ---", maxsplit=1)[0]).is_file()


def test_a_base_that_is_not_on_the_engine_is_named(client: Any, tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"base image no-such/base:1 \(BUILD_BASE\) is not on"):
        resolve_bases(client, tmp_path, Backend.CPU, {"BUILD_BASE": "no-such/base:1",
                                                      "RUNTIME_BASE": "no-such/base:1"})
