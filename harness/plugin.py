"""The harness's pytest plugin (registered through the ``pytest11`` entry point).

Options are prefixed ``--harness-``; each falls back to a ``HARNESS_*`` variable.
Fixtures give a test a built llama-server, the GGUF fixtures and a server factory
whose servers are always stopped: at the end of the test, on failure, on Ctrl-C and
at interpreter exit. Shared work (the build, the fixture files) is done once per
machine under file locks, so every xdist worker can ask for it safely.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.resolve import ensure_build
from harness.errors import HarnessError
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.runners.subprocess_runner import (
    DEFAULT_READY_TIMEOUT_S,
    SubprocessRunner,
    SubprocessServer,
    stop_all,
)

StartServer = Callable[[LaunchSpec], SubprocessServer]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "llama-server regression harness")
    group.addoption("--harness-server-bin", default=os.environ.get("HARNESS_SERVER_BIN"),
                    help="llama-server binary to test [env HARNESS_SERVER_BIN]; default: build "
                         "the pinned source for the CPU (cached).")
    group.addoption("--harness-source", default=os.environ.get("HARNESS_SOURCE"),
                    help="llama.cpp checkout to build instead of the pinned source "
                         "[env HARNESS_SOURCE].")
    group.addoption("--harness-ready-timeout", type=float,
                    default=float(os.environ.get("HARNESS_READY_TIMEOUT",
                                                 DEFAULT_READY_TIMEOUT_S)),
                    help="seconds a server may take to become ready [env HARNESS_READY_TIMEOUT].")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server: the test starts a real llama-server")


def pytest_keyboard_interrupt() -> None:
    stop_all()


def pytest_unconfigure() -> None:
    stop_all()


@pytest.fixture(scope="session")
def harness_cache() -> Path:
    return cache_root()


@pytest.fixture(scope="session")
def llama_server_binary(pytestconfig: pytest.Config, harness_cache: Path) -> Path:
    """The binary under test: ``--harness-server-bin``, or the cached CPU build."""
    explicit = pytestconfig.getoption("harness_server_bin")
    if explicit:
        return Path(explicit)
    source = pytestconfig.getoption("harness_source")
    try:
        result = ensure_build(harness_cache, BuildRequest(), Path(source) if source else None)
    except HarnessError as exc:
        pytest.fail(f"could not build llama-server: {exc}", pytrace=False)
    return result.binary


@pytest.fixture(scope="session")
def fixture_set() -> modelgen.FixtureSet:
    """The GGUF fixtures and bundles, written once per machine and verified by hash."""
    return modelgen.ensure_fixtures()


@pytest.fixture(scope="session")
def server_runner(pytestconfig: pytest.Config, llama_server_binary: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> SubprocessRunner:
    return SubprocessRunner(
        llama_server_binary,
        tmp_path_factory.mktemp("server-logs"),
        ready_timeout_s=pytestconfig.getoption("harness_ready_timeout"),
    )


@pytest.fixture
def start_server(server_runner: SubprocessRunner) -> Iterator[StartServer]:
    """Factory: ``start_server(LaunchSpec(...))`` returns a ready server, stopped after the test."""
    started: list[SubprocessServer] = []

    def start(spec: LaunchSpec) -> SubprocessServer:
        server = server_runner.start(spec)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
