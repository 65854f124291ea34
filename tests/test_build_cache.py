"""The build cache's control flow on a stand-in source tree that compiles in seconds.

Real CMake and a real compiler run here; only the source is a tiny fake, so the cache
hit, the lock and the failure report can be tested without a 5-minute build.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from test_bounded_waits import all_gone, hang_program, lock_held_elsewhere

from harness import bounded
from harness.builds import native
from harness.builds.compiler_cache import CCACHE_ENV, NO_CCACHE_FLAG, SOURCE_LINK
from harness.builds.native import build_server, builds_dir, cached_build, native_toolchain
from harness.builds.source import local_source
from harness.errors import BuildError
from harness.planning.build_plan import BuildRequest, build_key
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


def _ccache_counts(cache: Path) -> dict[str, int]:
    proc = subprocess.run(["ccache", "--print-stats"], capture_output=True, text=True,
                          check=True, env={**os.environ, "CCACHE_DIR": str(cache / "ccache")})
    counts = dict(line.split("\t", 1) for line in proc.stdout.splitlines() if "\t" in line)
    hits = int(counts.get("direct_cache_hit", 0)) + int(counts.get("preprocessed_cache_hit", 0))
    return {"hits": hits, "misses": int(counts.get("cache_miss", 0))}


@pytest.mark.skipif(shutil.which("ccache") is None,
                    reason="ccache is not installed (scripts/setup.sh installs it as root)")
def test_a_tree_that_differs_in_one_file_compiles_only_that_file(
        tmp_path: Path, fake_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two source trees at different paths share ccache's objects (the slowed build and
    the pinned one; two commits of a bisection): the unchanged file is a hit."""
    monkeypatch.delenv(CCACHE_ENV, raising=False)
    monkeypatch.delenv("CCACHE_DIR", raising=False)
    (fake_tree / "tools" / "server" / "shared.c").write_text("int shared(void) { return 7; }\n")
    other = tmp_path / "elsewhere" / "llama.cpp"
    shutil.copytree(fake_tree, other)
    with (other / "tools" / "server" / "server.c").open("a") as changed:
        changed.write("\nint changed_here(void) { return 1; }\n")
    cache = tmp_path / "cache"
    first = build_server(cache, local_source(fake_tree), BuildRequest(), jobs=1)
    assert _ccache_counts(cache) == {"hits": 0, "misses": 2}
    second = build_server(cache, local_source(other), BuildRequest(), jobs=1)
    assert second.info.key != first.info.key
    assert _ccache_counts(cache) == {"hits": 1, "misses": 3}
    assert (second.directory / SOURCE_LINK).resolve() == other.resolve()
    assert second.binary.is_file()


def test_without_a_compiler_cache_nothing_is_cached_or_linked(
        tmp_path: Path, fake_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CCACHE_ENV, "0")
    built = build_server(tmp_path / "cache", local_source(fake_tree), BuildRequest(), jobs=1)
    assert built.binary.is_file()
    assert not (built.directory / SOURCE_LINK).exists()
    assert not (tmp_path / "cache" / "ccache").exists()
    assert NO_CCACHE_FLAG in (built.directory / "build.log").read_text()


def test_a_hung_build_is_stopped_at_its_limit_with_every_compiler(
        tmp_path: Path, fake_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "COMPILE_LIMIT_S", 4.0)
    monkeypatch.setattr(bounded, "TERM_GRACE_S", 0.5)
    with hang_program(tmp_path) as (program, pids):
        request = BuildRequest(extra_cmake_args=(f"-DFAKE_HANG={program}",))
        started = time.monotonic()
        with pytest.raises(BuildError) as raised:
            build_server(tmp_path / "cache", local_source(fake_tree), request, jobs=1)
        # make or ninja, the shell it ran and the program's own child, which ignored
        # SIGTERM: all gone.
        assert all_gone(pids), "a process of the build outlived it"
    text = str(raised.value)
    assert "cmake --build ...` did not finish within its limit of 4 s" in text
    assert "harness.builds.native.COMPILE_LIMIT_S" in text
    log = Path(text.rsplit("full log: ", 1)[1].split(" ---", maxsplit=1)[0])
    # Ninja holds a command's output until it ends: the hang is silent, as in the field.
    assert log.read_text().splitlines()[-1].startswith(f"$ {shutil.which('cmake')} --build")
    assert not list((tmp_path / "cache" / "builds").glob("*/build.json"))
    assert time.monotonic() - started < 120  # configure, then 4 s: not the hang's 600 s


def test_a_build_lock_held_too_long_names_the_lock_and_its_holder(
        tmp_path: Path, fake_tree: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "BUILD_LOCK_WAIT_S", 1.0)
    cache, source, request = tmp_path / "cache", local_source(fake_tree), BuildRequest()
    key = build_key(source.digest, request, native_toolchain(request).compiler)
    lock = builds_dir(cache) / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    with lock_held_elsewhere(lock, f"building cpu llama-server {key}") as holder, \
            pytest.raises(BuildError) as raised:
        build_server(cache, source, request, jobs=1)
    text = str(raised.value)
    assert f"waited 1 s for the lock {lock}" in text
    assert f"pid {holder.pid} on" in text
    assert "harness.builds.native.BUILD_LOCK_WAIT_S" in text
