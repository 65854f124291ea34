"""The harness's pytest plugin (registered through the ``pytest11`` entry point).

Options are prefixed ``--harness-``; each falls back to a ``HARNESS_*`` variable.
Fixtures give a test a built llama-server, the GGUF fixtures and a server factory
whose servers are always stopped: at the end of the test, on failure, on Ctrl-C and
at interpreter exit. Shared work (the build, the fixture files) is done once per
machine under file locks, so every xdist worker can ask for it safely.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.container_build import build_image, image_backend
from harness.builds.resolve import resolve_source
from harness.builds.under_test import BuildUnderTest
from harness.errors import ConfigError, HarnessError
from harness.facts.build import Backend, Capabilities
from harness.paths import cache_root
from harness.plan_request import read_cards, read_plan_request
from harness.planning.build_plan import BuildRequest
from harness.planning.container_gpu import plan_gpu_access
from harness.planning.launch import LaunchSpec
from harness.planning.launch_plan import LaunchPlan, plan_launch
from harness.planning.routing import InferenceBackend
from harness.plugin.features import FeatureGate, ensure_launchable
from harness.plugin.idle_hypothesis import IdleHypothesis
from harness.plugin.recording.fingerprints import RecordFingerprint, fingerprint_recorder
from harness.plugin.recording.flakes_plugin import KnownFlakesPlugin
from harness.plugin.recording.pytest_plugin import RecordingPlugin
from harness.plugin.required import RequireSettingError, required_resources, skip_unless_present
from harness.plugin.session import SESSION_KEY, HarnessOptions, HarnessSession, add_options
from harness.plugin.start_guard import GuardedRunner
from harness.plugin.unverified import RecordUnverified, UnverifiedSummary, record_on
from harness.probes.bundles import load_bundle
from harness.probes.devices import Device
from harness.probes.docker_engine import docker_engine
from harness.probes.gpu_health import runner_gpu_health
from harness.runners.base import RunningServer, ServerRunner
from harness.runners.container_labels import SESSION_ID
from harness.runners.container_runner import ContainerRunner
from harness.runners.container_sweep import sweep_containers, sweep_orphans
from harness.runners.dispatch import Dispatcher, LlamaCppBackend
from harness.runners.external_runner import ExternalRunner
from harness.runners.live import stop_all
from harness.runners.observe import notify_planned
from harness.runners.subprocess_runner import SubprocessRunner

#: What every fixture hands a test: the one server seam (harness/runners/base.py), whichever
#: runner started it.
Server = RunningServer
ServerRunnerLike = ServerRunner[RunningServer]
StartServer = Callable[[LaunchSpec], Server]


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def pytest_configure(config: pytest.Config) -> None:
    # Every option and variable is parsed here, once: a bad one stops the run before any
    # test, naming itself.
    session = HarnessSession(HarnessOptions.from_config(config))
    config.stash[SESSION_KEY] = session
    session.user_bundles()  # a bad --harness-bundles folder is a usage error, now
    config.pluginmanager.register(RecordingPlugin(config, session), "harness-recording")
    config.pluginmanager.register(UnverifiedSummary(), "harness-unverified")
    config.pluginmanager.register(IdleHypothesis(), "harness-idle-hypothesis")
    config.pluginmanager.register(FeatureGate(session.options.require_features),
                                  "harness-features")
    flakes = KnownFlakesPlugin.from_option(config, session.options.known_flakes)
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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``any_bundle`` runs once per bundle: the fixture bundles and the
    user's (``--harness-bundles``, ids ``user:<folder>``)."""
    if "any_bundle" in metafunc.fixturenames:
        metafunc.parametrize("any_bundle", HarnessSession.of(metafunc.config).bundle_names())


def pytest_sessionstart(session: pytest.Session) -> None:
    """A run that demands a GPU backend or containers fails here when it has none, and a
    named build that does not exist fails here once, not in every test that needs it."""
    try:
        required_resources()
    except RequireSettingError as exc:
        pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
    harness = HarnessSession.of(session.config)
    options = harness.options
    if options.names_a_build:
        # Cheap (files are checked, nothing is built), so it is done for every run that
        # names one; the default CPU build stays lazy, as it may have to be compiled.
        try:
            harness.build()
        except pytest.UsageError as exc:
            pytest.exit(str(exc), returncode=pytest.ExitCode.USAGE_ERROR)
    if options.runner == "container":
        missing = harness.docker_missing()
        if missing:
            pytest.exit(f"--harness-runner=container: {missing}",
                        returncode=pytest.ExitCode.USAGE_ERROR)
        if not hasattr(session.config, "workerinput"):
            # Only the controller sweeps: containers an interrupted run left behind
            # (their owner process is gone); a live parallel session keeps its own.
            sweep_orphans(docker_engine())
    if options.require_gpu is not None:
        missing = _gpu_missing(harness, options.require_gpu, options.require_gpu_count)
        if missing:
            count = f":{options.require_gpu_count}" if options.require_gpu_count > 1 else ""
            pytest.exit(f"--harness-require-gpu={options.require_gpu.value}{count}: {missing}",
                        returncode=pytest.ExitCode.USAGE_ERROR)


def pytest_report_header(config: pytest.Config) -> list[str]:
    return HarnessSession.of(config).header_lines()


def pytest_runtest_setup(item: pytest.Item) -> None:
    harness = HarnessSession.of(item.config)
    if item.get_closest_marker("docker") is not None:
        skip_unless_present("docker", harness.docker_missing())
    for marker in item.iter_markers("gpu"):
        backend = Backend(marker.args[0])
        missing = _gpu_missing(harness, backend)
        if missing:
            if harness.options.require_gpu is backend:
                pytest.fail(f"this run requires {backend.value}: {missing}", pytrace=False)
            pytest.skip(f"needs a {backend.value} build and device: {missing} (run it on a "
                        f"{backend.value} runner with --harness-build and "
                        f"--harness-require-gpu={backend.value})")


def _gpu_missing(harness: HarnessSession, backend: Backend, count: int = 1) -> str | None:
    """None when the build under test is a ``backend`` build that sees ``count`` devices
    of it and this runner's vendor tool (NVML, AMD SMI, vulkaninfo) lists a usable GPU of it.

    Otherwise every problem, each with its fix: a runner whose driver is missing must
    not pass on a build that happens to list a software device (Vulkan's llvmpipe).
    """
    problems: list[str] = []
    build = harness.build()
    if build.backend is not backend:
        problems.append(
            f"the build under test ({build.binary}) is a {build.backend.value} build; give a "
            f"{backend.value} build with --harness-build (`harness build --backend "
            f"{backend.value}`)")
    else:
        try:
            devices = harness.devices()
        except HarnessError as exc:  # no access to the GPU from a container, a broken image
            problems.append(f"the build's devices could not be listed: {exc}")
        else:
            seen = sum(1 for d in devices if d.backend is backend)
            if not seen:
                problems.append(f"{build.binary} --list-devices shows no {backend.value} "
                                "device")
            elif seen < count:
                problems.append(f"{build.binary} --list-devices shows {seen} {backend.value} "
                                f"device{'s' * (seen != 1)}; this run needs {count}")
    health = runner_gpu_health(backend)
    if not health.usable:
        problems.append(f"this runner has no usable {backend.value} GPU: {health.reason}")
    return "; ".join(problems) or None


def pytest_keyboard_interrupt() -> None:
    stop_all()


def pytest_unconfigure(config: pytest.Config) -> None:
    recording = config.pluginmanager.get_plugin("harness-recording")
    if isinstance(recording, RecordingPlugin):
        recording.close()
    stop_all()
    harness = config.stash.get(SESSION_KEY, None)
    if (harness is not None and harness.options.runner == "container"
            and not harness.docker_missing()):
        sweep_containers(docker_engine(), session=SESSION_ID)


@pytest.fixture
def unverified_fields(request: pytest.FixtureRequest) -> RecordUnverified:
    """Record planned fields this build cannot show (name → reason): counted once per field
    and reason in the run's terminal summary (harness/plugin/unverified.py)."""
    return record_on(request.node)


@pytest.fixture
def record_fingerprint(request: pytest.FixtureRequest) -> RecordFingerprint:
    """Keep a numerics probe's fingerprint in the run record (recording/fingerprints.py)."""
    return fingerprint_recorder(request.node)


@pytest.fixture(scope="session")
def harness_cache() -> Path:
    return cache_root()


@pytest.fixture(scope="session")
def harness_build(pytestconfig: pytest.Config) -> BuildUnderTest:
    """The build under test: ``--harness-build``, ``--harness-server-bin`` or the CPU build."""
    return HarnessSession.of(pytestconfig).build()


@pytest.fixture(scope="session")
def llama_server_binary(harness_build: BuildUnderTest) -> Path:
    return harness_build.binary


@pytest.fixture(scope="session")
def build_devices(pytestconfig: pytest.Config) -> tuple[Device, ...]:
    """The GPU devices the build under test sees; empty on a CPU build."""
    return HarnessSession.of(pytestconfig).devices()


@pytest.fixture(scope="session")
def fixture_set() -> modelgen.FixtureSet:
    """The GGUF fixtures and bundles, written once per machine and verified by hash."""
    return modelgen.ensure_fixtures()


BundleDir = Callable[[str], Path]


@pytest.fixture(scope="session")
def bundle_dir(fixture_set: modelgen.FixtureSet, pytestconfig: pytest.Config) -> BundleDir:
    """``bundle_dir(name)``: the folder of a fixture bundle, or of a user's bundle
    (``user:<folder>``, from ``--harness-bundles``)."""
    users = HarnessSession.of(pytestconfig).user_bundles()

    def find(name: str) -> Path:
        return users[name].root if name in users else fixture_set.bundle(name)

    return find


@pytest.fixture(scope="session")
def container_image(pytestconfig: pytest.Config, harness_build: BuildUnderTest) -> str:
    """The image the container runner starts: --harness-image, the build's, or the CPU one."""
    named = HarnessSession.of(pytestconfig).options.image
    if named:
        return named
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
    session = HarnessSession.of(pytestconfig)
    options = session.options
    # A ROCm build's launch environment (rocm_env.py): the cards it has no code for hidden.
    planned_env = session.launch_env()
    shared = {**(shared or {}), **(planned_env.environment if planned_env else {})} or None
    if options.threads is not None:
        threads = options.threads
    log_dir = tmp_path_factory.mktemp("server-logs")
    timeout = options.ready_timeout_s
    external = options.external_server
    if external:
        # A server the developer started: nothing is built or launched for it.
        try:
            return ExternalRunner(external, log_dir, ready_timeout_s=timeout)
        except ConfigError as exc:
            raise pytest.UsageError(str(exc)) from exc
    if options.runner == "container":
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


@pytest.fixture(scope="session")
def build_capabilities(pytestconfig: pytest.Config) -> Capabilities:
    """What the build under test accepts, its ``--help`` (``HarnessSession.capabilities``)."""
    return HarnessSession.of(pytestconfig).capabilities()


@pytest.fixture
def start_server(server_runner: ServerRunnerLike, build_capabilities: Capabilities,
                 harness_build: BuildUnderTest) -> Iterator[StartServer]:
    """Factory: ``start_server(LaunchSpec(...))`` returns a ready server, stopped after the
    test. A spec needing a feature the build lacks is not sent: the test skips."""
    started: list[Server] = []
    guarded = GuardedRunner(server_runner, harness_build)

    def start(spec: LaunchSpec) -> Server:
        ensure_launchable(spec, build_capabilities, harness_build)
        server = guarded.start(spec)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


PlanFor = Callable[..., LaunchPlan]
LaunchPlanned = Callable[[LaunchPlan], Server]


@pytest.fixture(scope="session")
def plan_for(fixture_set: modelgen.FixtureSet, bundle_dir: BundleDir,
             harness_build: BuildUnderTest, pytestconfig: pytest.Config) -> PlanFor:
    """``plan_for(bundle=NAME | model=NAME, **PlanRequest fields)``: a plan for the build
    (a bundle NAME may be a user's, ``user:<folder>``); ``gpu`` defaults to
    ``--harness-planner-gpu`` (none unless given); ``projector=PATH``: a vision projector."""
    session = HarnessSession.of(pytestconfig)
    cards = read_cards()  # once a session: every plan reads the same packaged cards

    def plan(*, bundle: str | None = None, model: str | None = None,
             **changes: object) -> LaunchPlan:
        if bundle is not None:
            request = read_plan_request(build=harness_build, cards=cards,
                                        bundle=load_bundle(bundle_dir(bundle)),
                                        projector=changes.pop("projector", None))  # type: ignore[arg-type]
        else:
            assert model is not None, "plan_for needs bundle= or model="
            request = read_plan_request(build=harness_build, cards=cards,
                                        model=fixture_set.model(model),
                                        projector=changes.pop("projector", None))  # type: ignore[arg-type]
        defaults = {"gpu": session.options.planner_gpu, "launch_env": session.launch_env()}
        changes = {**{k: v for k, v in defaults.items() if v is not None}, **changes}
        made = plan_launch(dataclasses.replace(request, **changes))  # type: ignore[arg-type]
        notify_planned(made)
        return made

    return plan


@pytest.fixture
def launch(server_runner: ServerRunnerLike, build_capabilities: Capabilities,
           harness_build: BuildUnderTest) -> Iterator[LaunchPlanned]:
    """Dispatch a plan to the llama-cpp backend; every server is stopped after the test.

    A plan that needs a feature the build lacks is not sent: the test skips with the
    plan's words, or fails under ``--harness-require-features``."""
    guarded = GuardedRunner(server_runner, harness_build)
    dispatcher = Dispatcher({InferenceBackend.LLAMA_CPP: LlamaCppBackend(guarded)})
    started: list[Server] = []

    def start(plan: LaunchPlan) -> Server:
        # A feature the build lacks is never sent: the test skips (harness/plugin/features.py).
        # The spec is checked again, for a test that changed it after planning.
        plan.ensure_sendable()
        ensure_launchable(plan.spec, build_capabilities, harness_build)
        notify_planned(plan)
        server = dispatcher.dispatch(plan)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
