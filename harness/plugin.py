"""The harness's pytest plugin (registered through the ``pytest11`` entry point).

Options are prefixed ``--harness-``; each falls back to a ``HARNESS_*`` variable.
Fixtures give a test a built llama-server, the GGUF fixtures and a server factory
whose servers are always stopped: at the end of the test, on failure, on Ctrl-C and
at interpreter exit. Shared work (the build, the fixture files) is done once per
machine under file locks, so every xdist worker can ask for it safely.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.container_build import build_image, image_backend
from harness.builds.resolve import ensure_build, resolve_source
from harness.builds.under_test import (
    BuildUnderTest,
    from_result,
    resolve_named_build,
    run_image,
)
from harness.errors import ConfigError, HarnessError
from harness.facts.build import Backend, Capabilities
from harness.facts.gpu import GpuInfo
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest
from harness.planning.container_gpu import plan_gpu_access
from harness.planning.launch import LaunchSpec
from harness.planning.plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.routing import InferenceBackend
from harness.probes.bundles import load_bundle
from harness.probes.devices import Device, list_devices, list_devices_in_image
from harness.probes.docker_engine import docker_engine, engine_unavailable
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_access import check_gpu_access
from harness.probes.gpu_configs import load_fork_kv_types, load_gpu_configs
from harness.probes.gpu_health import runner_gpu_health
from harness.recording.flakes_plugin import KnownFlakesPlugin
from harness.recording.pytest_plugin import RecordingPlugin
from harness.repro.properties import parse_gpu_spec
from harness.required import RequireSettingError, required_resources, skip_unless_present
from harness.runners.container_runner import (
    SESSION_ID,
    ContainerRunner,
    ContainerServer,
    sweep_containers,
    sweep_orphans,
)
from harness.runners.container_runner import stop_all as stop_all_containers
from harness.runners.dispatch import Dispatcher, LlamaCppBackend
from harness.runners.external_runner import ExternalRunner, ExternalServer
from harness.runners.observe import notify_planned
from harness.runners.subprocess_runner import (
    DEFAULT_READY_TIMEOUT_S,
    SubprocessRunner,
    SubprocessServer,
    stop_all,
)

Server = SubprocessServer | ContainerServer | ExternalServer
ServerRunnerLike = SubprocessRunner | ContainerRunner | ExternalRunner
StartServer = Callable[[LaunchSpec], Server]
GPU_BACKENDS = (Backend.CUDA, Backend.ROCM, Backend.VULKAN)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("harness", "llama-server regression harness")
    group.addoption("--harness-build", default=os.environ.get("HARNESS_BUILD"),
                    help="the build to gate: a build key in the cache, a build.json or a "
                         "llama-server binary [env HARNESS_BUILD].")
    group.addoption("--harness-require-gpu", choices=[b.value for b in GPU_BACKENDS],
                    default=os.environ.get("HARNESS_REQUIRE_GPU") or None,
                    help="fail (instead of skipping) when the build under test has no device of "
                         "this backend [env HARNESS_REQUIRE_GPU].")
    group.addoption("--harness-runner", choices=["subprocess", "container"],
                    default=os.environ.get("HARNESS_RUNNER") or "subprocess",
                    help="how servers run: child processes or containers [env HARNESS_RUNNER].")
    group.addoption("--harness-image", default=os.environ.get("HARNESS_IMAGE") or None,
                    help="llama-server image for the container runner [env HARNESS_IMAGE]; "
                         "default: the build under test's image, else the CPU image of the "
                         "pinned source (built if missing).")
    group.addoption("--harness-server-bin", default=os.environ.get("HARNESS_SERVER_BIN"),
                    help="llama-server binary to test [env HARNESS_SERVER_BIN]; default: build "
                         "the pinned source for the CPU (cached).")
    group.addoption("--harness-source", default=os.environ.get("HARNESS_SOURCE"),
                    help="llama.cpp checkout to build instead of the pinned source "
                         "[env HARNESS_SOURCE].")
    group.addoption("--harness-run-record", default=os.environ.get("HARNESS_RUN_RECORD") or None,
                    help="write the run record (outcomes, hardware, build, performance "
                         "figures of every server) to this run.json; servers are measured "
                         "before they stop [env HARNESS_RUN_RECORD].")
    group.addoption("--harness-threads", type=int,
                    default=int(os.environ["HARNESS_THREADS"])
                    if os.environ.get("HARNESS_THREADS") else None,
                    help="--threads for every server whose launch leaves it unset; default: "
                         "the server's own choice, or the cores shared out between xdist "
                         "workers [env HARNESS_THREADS].")
    group.addoption("--harness-ready-timeout", type=float,
                    default=float(os.environ.get("HARNESS_READY_TIMEOUT",
                                                 DEFAULT_READY_TIMEOUT_S)),
                    help="seconds a server may take to become ready [env HARNESS_READY_TIMEOUT].")
    group.addoption("--harness-planner-gpu", type=_planner_gpu_option,
                    default=os.environ.get("HARNESS_PLANNER_GPU") or None,
                    metavar="NAME:VRAM_MIB",
                    help="the GPU plan_for plans for when a test names none (default: none); "
                         "harness repro passes the one a run recorded [env HARNESS_PLANNER_GPU].")
    group.addoption("--harness-external-server", metavar="URL",
                    default=os.environ.get("HARNESS_EXTERNAL_SERVER") or None,
                    help="attach every server start to this already running llama-server "
                         "instead of starting one; its launch flags are yours "
                         "[env HARNESS_EXTERNAL_SERVER].")
    group.addoption("--harness-known-flakes", metavar="PATH",
                    default=os.environ.get("HARNESS_KNOWN_FLAKES") or None,
                    help="the reviewed known-flakes list (default: ci/known-flakes.yaml of the "
                         "checkout when it has one; `none` turns it off) "
                         "[env HARNESS_KNOWN_FLAKES].")


def _planner_gpu_option(text: str) -> GpuInfo:
    try:
        return parse_gpu_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def planner_gpu(config: pytest.Config) -> GpuInfo | None:
    """The GPU ``plan_for`` plans for when a test names none (``--harness-planner-gpu``)."""
    value = config.getoption("harness_planner_gpu")
    return value if isinstance(value, GpuInfo) else None


def pytest_configure(config: pytest.Config) -> None:
    run_json = config.getoption("harness_run_record")
    config.pluginmanager.register(
        RecordingPlugin(config, Path(run_json).resolve() if run_json else None,
                        lambda: config.stash.get(_BUILD_KEY, None)),
        "harness-recording")
    flakes = KnownFlakesPlugin.from_config(config)
    if flakes is not None:
        config.pluginmanager.register(flakes, "harness-known-flakes")
    config.addinivalue_line("markers", "server: the test starts a real llama-server")
    config.addinivalue_line(
        "markers", "gpu(backend): the test needs a build and a device of this GPU backend "
        "(cuda, rocm or vulkan); skipped without one unless --harness-require-gpu names it")
    config.addinivalue_line(
        "markers", "docker: the test needs a Docker engine; skipped with the reason without one")
    config.addinivalue_line(
        "markers", "alone: the test measures speed, so it runs after the parallel run with "
        "nothing beside it (scripts/test.sh runs `-m alone` on its own)")


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run that demands a GPU backend or containers fails here when it has none, and a
    named build that does not exist fails here once, not in every test that needs it."""
    try:
        required_resources()
    except RequireSettingError as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
    config = session.config
    if config.getoption("harness_build") or config.getoption("harness_server_bin"):
        # Cheap (files are checked, nothing is built), so it is done for every run that
        # names one; the default CPU build stays lazy, as it may have to be compiled.
        try:
            build_under_test(config)
        except pytest.UsageError as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
    if session.config.getoption("harness_runner") == "container":
        missing = _docker_missing(session.config)
        if missing:
            pytest.exit(f"--harness-runner=container: {missing}",
                        returncode=pytest.ExitCode.USAGE_ERROR)
        if not hasattr(session.config, "workerinput"):
            # Only the controller sweeps: containers an interrupted run left behind
            # (their owner process is gone); a live parallel session keeps its own.
            sweep_orphans(docker_engine())
    required = session.config.getoption("harness_require_gpu")
    allowed = [b.value for b in GPU_BACKENDS]
    if required and required not in allowed:
        # argparse checks `choices` only for values given on the command line, so a bad
        # HARNESS_REQUIRE_GPU (the option's default) arrives here unchecked.
        pytest.exit(f"HARNESS_REQUIRE_GPU={required!r} is not a GPU backend; allowed: "
                    f"{', '.join(allowed)} (or leave it unset to run without demanding one)",
                    returncode=pytest.ExitCode.USAGE_ERROR)
    if required:
        missing = _gpu_missing(session.config, Backend(required))
        if missing:
            pytest.exit(f"--harness-require-gpu={required}: {missing}",
                        returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("docker") is not None:
        skip_unless_present("docker", _docker_missing(item.config))
    for marker in item.iter_markers("gpu"):
        backend = Backend(marker.args[0])
        missing = _gpu_missing(item.config, backend)
        if missing:
            if item.config.getoption("harness_require_gpu") == backend.value:
                pytest.fail(f"this run requires {backend.value}: {missing}", pytrace=False)
            pytest.skip(f"needs a {backend.value} build and device: {missing} (run it on a "
                        f"{backend.value} runner with --harness-build and "
                        f"--harness-require-gpu={backend.value})")


_DOCKER_KEY = pytest.StashKey["str | None"]()
_BUILD_KEY = pytest.StashKey["BuildUnderTest"]()
_DEVICES_KEY = pytest.StashKey["tuple[Device, ...]"]()


def _docker_missing(config: pytest.Config) -> str | None:
    if _DOCKER_KEY not in config.stash:
        config.stash[_DOCKER_KEY] = engine_unavailable()
    return config.stash[_DOCKER_KEY]


def build_under_test(config: pytest.Config) -> BuildUnderTest:
    """The build this run gates, resolved once per process (building it if needed)."""
    if _BUILD_KEY not in config.stash:
        config.stash[_BUILD_KEY] = _resolve_build(config)
    return config.stash[_BUILD_KEY]


def _resolve_build(config: pytest.Config) -> BuildUnderTest:
    cache = cache_root()
    named = config.getoption("harness_build")
    explicit = config.getoption("harness_server_bin")
    source = config.getoption("harness_source")
    try:
        if named:
            return resolve_named_build(named, cache)
        if explicit:
            return resolve_named_build(explicit, cache, option="--harness-server-bin")
        return from_result(ensure_build(cache, BuildRequest(), Path(source) if source else None))
    except HarnessError as exc:
        raise pytest.UsageError(f"no build under test: {exc}") from exc


def devices_of_build(config: pytest.Config) -> tuple[Device, ...]:
    """The GPU devices the build under test sees (``--list-devices``), listed once.

    A container run asks the server inside its image, with the GPU access its servers
    get: a container build's binary exists only in the image.
    """
    if _DEVICES_KEY not in config.stash:
        build = build_under_test(config)
        image = run_image(build, config.getoption("harness_runner"),
                          config.getoption("harness_image"))
        config.stash[_DEVICES_KEY] = (_devices_in_image(image) if image is not None
                                      else list_devices(build.binary))
    return config.stash[_DEVICES_KEY]


def _devices_in_image(image: str) -> tuple[Device, ...]:
    client = docker_engine()
    try:
        access = plan_gpu_access(image_backend(client, image), main_gpu=0)
        runtimes = (client.info().get("Runtimes") or {}) if access is not None else {}
        gpu = check_gpu_access(access, runtimes) if access is not None else None
        return list_devices_in_image(client, image, gpu)
    finally:
        client.close()


def _gpu_missing(config: pytest.Config, backend: Backend) -> str | None:
    """None when the build under test is a ``backend`` build that sees a device of it and
    this runner's vendor tool (NVML, AMD SMI, vulkaninfo) lists a usable GPU of it.

    Otherwise every problem, each with its fix: a runner whose driver is missing must
    not pass on a build that happens to list a software device (Vulkan's llvmpipe).
    """
    problems: list[str] = []
    build = build_under_test(config)
    if build.backend is not backend:
        problems.append(
            f"the build under test ({build.binary}) is a {build.backend.value} build; give a "
            f"{backend.value} build with --harness-build (`harness build --backend "
            f"{backend.value}`)")
    else:
        try:
            devices = devices_of_build(config)
        except HarnessError as exc:  # no access to the GPU from a container, a broken image
            problems.append(f"the build's devices could not be listed: {exc}")
        else:
            if not any(d.backend is backend for d in devices):
                problems.append(f"{build.binary} --list-devices shows no {backend.value} "
                                "device")
    health = runner_gpu_health(backend)
    if not health.usable:
        problems.append(f"this runner has no usable {backend.value} GPU: {health.reason}")
    return "; ".join(problems) or None


def pytest_keyboard_interrupt() -> None:
    stop_all()
    stop_all_containers()


def pytest_unconfigure(config: pytest.Config) -> None:
    recording = config.pluginmanager.get_plugin("harness-recording")
    if isinstance(recording, RecordingPlugin):
        recording.close()
    stop_all()
    stop_all_containers()
    if config.getoption("harness_runner") == "container" and not _docker_missing(config):
        sweep_containers(docker_engine(), session=SESSION_ID)


@pytest.fixture(scope="session")
def harness_cache() -> Path:
    return cache_root()


@pytest.fixture(scope="session")
def harness_build(pytestconfig: pytest.Config) -> BuildUnderTest:
    """The build under test: ``--harness-build``, ``--harness-server-bin`` or the CPU build."""
    return build_under_test(pytestconfig)


@pytest.fixture(scope="session")
def llama_server_binary(harness_build: BuildUnderTest) -> Path:
    return harness_build.binary


@pytest.fixture(scope="session")
def build_devices(pytestconfig: pytest.Config) -> tuple[Device, ...]:
    """The GPU devices the build under test sees; empty on a CPU build."""
    return devices_of_build(pytestconfig)


@pytest.fixture(scope="session")
def fixture_set() -> modelgen.FixtureSet:
    """The GGUF fixtures and bundles, written once per machine and verified by hash."""
    return modelgen.ensure_fixtures()


@pytest.fixture(scope="session")
def container_image(pytestconfig: pytest.Config, harness_build: BuildUnderTest) -> str:
    """The image the container runner starts: --harness-image, the build's, or the CPU one."""
    named = pytestconfig.getoption("harness_image")
    if named:
        return str(named)
    if harness_build.info is not None and harness_build.info.image:
        return harness_build.info.image
    cache = cache_root()
    try:
        built = build_image(docker_engine(), cache, resolve_source(cache, None), BuildRequest())
    except HarnessError as exc:
        raise pytest.UsageError(f"no llama-server image for the container runner: {exc}") \
            from exc
    assert built.info.image is not None
    return built.info.image


@pytest.fixture(scope="session")
def server_runner(request: pytest.FixtureRequest, pytestconfig: pytest.Config,
                  tmp_path_factory: pytest.TempPathFactory) -> ServerRunnerLike:
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    shared: dict[str, str] | None = None
    threads: int | None = None
    if workers > 1:
        # Servers of parallel workers share the cores: give each its share, and keep
        # llama.cpp's OpenMP threads from spinning while they wait (measured: with
        # spinning, two workers on 2 cores ran the suites slower than one).
        shared = {"OMP_WAIT_POLICY": "PASSIVE"}
        threads = max(1, (os.cpu_count() or 1) // workers)
    pinned = pytestconfig.getoption("harness_threads")
    if pinned is not None:
        threads = pinned
    log_dir = tmp_path_factory.mktemp("server-logs")
    timeout = pytestconfig.getoption("harness_ready_timeout")
    external = pytestconfig.getoption("harness_external_server")
    if external:
        # A server the developer started: nothing is built or launched for it.
        try:
            return ExternalRunner(external, log_dir, ready_timeout_s=timeout)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from exc
    if pytestconfig.getoption("harness_runner") == "container":
        image = request.getfixturevalue("container_image")
        # The image's backend decides what the container is given: the NVIDIA device
        # request, AMD's /dev/kfd and /dev/dri, or /dev/dri for Vulkan (main GPU 0, as
        # every card config plans it).
        client = docker_engine()
        try:
            gpu = plan_gpu_access(image_backend(client, image), main_gpu=0)
        finally:
            client.close()
        return ContainerRunner(image, log_dir, ready_timeout_s=timeout, env=shared,
                               default_threads=threads, gpu=gpu)
    binary: Path = request.getfixturevalue("llama_server_binary")
    return SubprocessRunner(binary, log_dir, ready_timeout_s=timeout,
                            env={**os.environ, **shared} if shared else None,
                            default_threads=threads)


@pytest.fixture
def start_server(server_runner: ServerRunnerLike) -> Iterator[StartServer]:
    """Factory: ``start_server(LaunchSpec(...))`` returns a ready server, stopped after the test."""
    started: list[Server] = []

    def start(spec: LaunchSpec) -> Server:
        server = server_runner.start(spec)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


PlanFor = Callable[..., LaunchPlan]
LaunchPlanned = Callable[[LaunchPlan], Server]


@pytest.fixture(scope="session")
def plan_for(fixture_set: modelgen.FixtureSet, harness_build: BuildUnderTest,
             pytestconfig: pytest.Config) -> PlanFor:
    """``plan_for(bundle=NAME | model=NAME, **PlanRequest fields)``: a plan for the build;
    ``gpu`` defaults to ``--harness-planner-gpu`` (none unless given)."""
    default_gpu = planner_gpu(pytestconfig)
    configs = load_gpu_configs()
    forks = load_fork_kv_types()
    capabilities = harness_build.info.capabilities if harness_build.info else Capabilities()

    def plan(*, bundle: str | None = None, model: str | None = None,
             **changes: object) -> LaunchPlan:
        if bundle is not None:
            loaded = load_bundle(fixture_set.bundle(bundle))
            drafter = loaded.drafter_path
            request = PlanRequest(
                model_path=loaded.text_model, model=read_model_facts(loaded.text_model),
                bundle=loaded, drafter_model=read_model_facts(drafter) if drafter else None)
        else:
            assert model is not None, "plan_for needs bundle= or model="
            path = fixture_set.model(model)
            request = PlanRequest(model_path=path, model=read_model_facts(path))
        request = dataclasses.replace(request, configs=configs, fork_kv_types=forks,
                                      capabilities=capabilities, build_key=harness_build.key)
        if default_gpu is not None and "gpu" not in changes:
            changes["gpu"] = default_gpu
        made = plan_launch(dataclasses.replace(request, **changes))  # type: ignore[arg-type]
        notify_planned(made)
        return made

    return plan


@pytest.fixture
def launch(server_runner: ServerRunnerLike) -> Iterator[LaunchPlanned]:
    """Dispatch a plan to the llama-cpp backend; every server is stopped after the test."""
    dispatcher = Dispatcher({InferenceBackend.LLAMA_CPP: LlamaCppBackend(server_runner)})
    started: list[Server] = []

    def start(plan: LaunchPlan) -> Server:
        notify_planned(plan)
        server = dispatcher.dispatch(plan)
        assert isinstance(server, Server)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
