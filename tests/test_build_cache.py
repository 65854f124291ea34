"""The build cache's control flow on a stand-in source tree that compiles in seconds.

Real CMake and a real compiler run here; only the source is a tiny fake, so the cache
hit, the lock and the failure report can be tested without a 5-minute build.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness.builds.native import build_server, cached_build
from harness.builds.source import local_source
from harness.errors import BuildError
from harness.planning.build_plan import BuildRequest
from harness.probes.toolchain import compiler_version

FAKE_TREE = Path(__file__).parent / "data" / "fake-llama"


@pytest.fixture
def fake_tree(tmp_path: Path) -> Path:
    tree = tmp_path / "llama.cpp"
    shutil.copytree(FAKE_TREE, tree)
    return tree


def test_first_call_builds_and_records_second_is_a_cache_hit(tmp_path: Path,
                                                             fake_tree: Path) -> None:
    counter = tmp_path / "configured.txt"
    request = BuildRequest(extra_cmake_args=(f"-DFAKE_COUNTER={counter}",))
    source = local_source(fake_tree)
    first = build_server(tmp_path / "cache", source, request, jobs=1)
    assert not first.cache_hit
    assert first.binary.is_file()
    info = first.info
    assert info.version == "version: 0.0.0-fake (build 0, commit fake)"
    assert info.capabilities.cache_types_k == ("f16", "q8_0")
    assert info.capabilities.spec_types == ("none", "draft-simple")
    assert info.source_digest == source.digest
    assert (first.directory / "build.log").is_file()
    assert (first.directory / "build.json").is_file()

    second = build_server(tmp_path / "cache", source, request, jobs=1)
    assert second.cache_hit
    assert second.info == info
    assert counter.read_text().count("configured") == 1  # CMake did not run again
    assert cached_build(tmp_path / "cache", source, request, compiler_version()) is not None


def test_a_changed_source_is_a_new_build(tmp_path: Path, fake_tree: Path) -> None:
    first = build_server(tmp_path / "cache", local_source(fake_tree), BuildRequest(), jobs=1)
    (fake_tree / "tools" / "server" / "extra.txt").write_text("changed")
    second = build_server(tmp_path / "cache", local_source(fake_tree), BuildRequest(), jobs=1)
    assert second.info.key != first.info.key
    assert not second.cache_hit


def test_failed_build_reports_log_tail_and_path(tmp_path: Path, fake_tree: Path) -> None:
    request = BuildRequest(extra_cmake_args=("-DFAKE_FAIL=on-purpose",))
    with pytest.raises(BuildError) as info:
        build_server(tmp_path / "cache", local_source(fake_tree), request, jobs=1)
    text = str(info.value)
    assert "fake configure failure requested: on-purpose" in text
    assert "last 40 lines of the build log" in text
    log = text.rsplit("full log: ", 1)[1].split(" ---", maxsplit=1)[0]
    assert Path(log).is_file()
    # Nothing was recorded as built, so the next call tries again instead of a cache hit.
    assert not list((tmp_path / "cache" / "builds").glob("*/build.json"))


def test_concurrent_builders_build_once(tmp_path: Path, fake_tree: Path) -> None:
    counter = tmp_path / "configured.txt"
    script = textwrap.dedent(f"""
        from pathlib import Path
        from harness.builds.native import build_server
        from harness.builds.source import local_source
        from harness.planning.build_plan import BuildRequest
        request = BuildRequest(extra_cmake_args=("-DFAKE_COUNTER={counter}",))
        result = build_server(Path({str(tmp_path / "cache")!r}),
                              local_source(Path({str(fake_tree)!r})), request, jobs=1)
        print(result.info.key)
    """)
    workers = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                text=True) for _ in range(3)]
    keys = {worker.communicate(timeout=300)[0].strip() for worker in workers}
    assert all(worker.returncode == 0 for worker in workers)
    assert len(keys) == 1
    assert counter.read_text().count("configured") == 1
