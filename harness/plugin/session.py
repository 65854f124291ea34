"""One pytest session's harness state: the options, parsed and checked once, and what
they resolve to (the build under test, the devices it sees, whether Docker answers).

``harness.plugin`` makes a :class:`HarnessSession` in ``pytest_configure`` and keeps it
on ``config.stash`` under :data:`SESSION_KEY`; the plugin's hooks and fixtures and the
recording plugin all read that one object, so neither plugin reaches into the other
(pytest-benchmark's ``BenchmarkSession`` is the model). Every ``--harness-*`` option
falls back to its ``HARNESS_*`` variable through the same parser as the option, so a bad
variable is one usage error naming it, not a traceback when options are declared.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import pytest

from harness import modelgen
from harness.builds.devices_seen import devices_seen, plan_launch_env
from harness.builds.resolve import ensure_build
from harness.builds.under_test import BuildUnderTest, from_result, resolve_named_build, run_image
from harness.errors import ConfigError, HarnessError
from harness.facts.build import Backend, Capabilities
from harness.facts.catalog import Bundle
from harness.facts.gpu import GpuInfo
from harness.paths import cache_root
from harness.planning.build_plan import SUITE_BUILD, BuildRequest
from harness.planning.rocm_env import RocmLaunchEnv
from harness.plugin.gpu_requirement import GpuRequirement, gpu_requirement
from harness.probes.bundle_folder import load_bundle_folder
from harness.probes.devices import Device
from harness.probes.docker_engine import engine_unavailable
from harness.repro.properties import parse_gpu_spec
from harness.runners.launching import DEFAULT_READY_TIMEOUT_S

RUNNERS = ("subprocess", "container")

_T = TypeVar("_T")


# -- parsers: one per option, used for the command line and for the variable -------------


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not at least 1")
    return value


def positive_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds above 0")
    return value


def gpu_spec(text: str) -> GpuInfo:
    try:
        return parse_gpu_spec(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def text(value: str) -> str:
    return value


_YES = frozenset({"1", "true", "on", "yes"})
_NO = frozenset({"0", "false", "off", "no"})


def switch(text: str) -> bool:
    """A switch's variable: ``1/true/on/yes`` or ``0/false/off/no`` (any case)."""
    word = text.strip().lower()
    if word in _YES | _NO:
        return word in _YES
    raise argparse.ArgumentTypeError(f"{text!r} is not one of 1, true, on, yes, 0, false, "
                                     "off, no")


@dataclass(frozen=True)
class OptionSpec:
    """A ``--harness-NAME`` option, its ``HARNESS_*`` variable and its parser.

    ``choices``: the allowed words; argparse checks them on the command line (its own
    "invalid choice" message), :meth:`parse_variable` in the variable. A ``parse`` of
    :func:`switch` makes the option a flag without a value (its variable takes ``1``).
    """

    name: str
    variable: str
    parse: Callable[[str], object]
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] = ()

    def parse_variable(self, raw: str) -> object:
        if self.choices and raw not in self.choices:
            raise argparse.ArgumentTypeError(
                f"{raw!r} is not one of {', '.join(self.choices)}")
        return self.parse(raw)

    @property
    def flag(self) -> str:
        return "--harness-" + self.name.replace("_", "-")

    @property
    def dest(self) -> str:
        return "harness_" + self.name


OPTIONS: tuple[OptionSpec, ...] = (
    OptionSpec("build", "HARNESS_BUILD", text,
               "the build to gate: a build key in the cache, a build.json or a llama-server "
               "binary"),
    OptionSpec("require_gpu", "HARNESS_REQUIRE_GPU", gpu_requirement,
               "fail (instead of skipping) when the build under test has no device of this "
               "backend (cuda, rocm or vulkan), or with BACKEND:N fewer than N of them (a "
               "multi-GPU runner: cuda:2)", metavar="BACKEND[:N]"),
    OptionSpec("require_features", "HARNESS_REQUIRE_FEATURES", switch,
               "fail (instead of skipping) a test whose launch needs a feature the build "
               "under test lacks ('not supported by this build: FLAG')"),
    OptionSpec("runner", "HARNESS_RUNNER", text,
               "how servers run: child processes (the default) or containers",
               choices=RUNNERS),
    OptionSpec("image", "HARNESS_IMAGE", text,
               "llama-server image for the container runner; default: the build under "
               "test's image, else the CPU image of the pinned source (built if missing)"),
    OptionSpec("server_bin", "HARNESS_SERVER_BIN", text,
               "llama-server binary to test; default: build the pinned source for the CPU "
               "(cached)"),
    OptionSpec("source", "HARNESS_SOURCE", text,
               "llama.cpp checkout to build instead of the pinned source"),
    OptionSpec("run_record", "HARNESS_RUN_RECORD", text,
               "write the run record (outcomes, hardware, build, performance figures of "
               "every server) to this run.json; servers are measured before they stop"),
    OptionSpec("threads", "HARNESS_THREADS", positive_int,
               "--threads for every server whose launch leaves it unset; default: the "
               "server's own choice, or the cores shared out between xdist workers"),
    OptionSpec("ready_timeout", "HARNESS_READY_TIMEOUT", positive_seconds,
               f"seconds a server may take to become ready (default "
               f"{DEFAULT_READY_TIMEOUT_S:g})"),
    OptionSpec("planner_gpu", "HARNESS_PLANNER_GPU", gpu_spec,
               "the GPU plan_for plans for when a test names none (default: none); harness "
               "repro passes the one a run recorded", metavar="NAME:VRAM_MIB"),
    OptionSpec("external_server", "HARNESS_EXTERNAL_SERVER", text,
               "attach every server start to this already running llama-server instead of "
               "starting one; its launch flags are yours", metavar="URL"),
    OptionSpec("known_flakes", "HARNESS_KNOWN_FLAKES", text,
               "the reviewed known-flakes list (default: the packaged "
               "harness/resources/known-flakes.yaml; `none` turns it off)", metavar="PATH"),
    OptionSpec("bundles", "HARNESS_BUNDLES", text,
               "a folder of your own fused bundles (one subfolder each, in the fixtures' "
               "layout): every suite parametrized over bundles runs over them too, as "
               "user:<folder>", metavar="DIR"),
)


def add_options(parser: pytest.Parser) -> None:
    """Declare every option; defaults stay None so the variable is read, and checked, later."""
    group = parser.getgroup("harness", "llama-server regression harness")
    for spec in OPTIONS:
        if spec.parse is switch:
            group.addoption(spec.flag, dest=spec.dest, action="store_const", const=True,
                            default=None, help=f"{spec.help} [env {spec.variable}=1].")
        elif spec.choices:
            group.addoption(spec.flag, dest=spec.dest, choices=list(spec.choices),
                            default=None, help=f"{spec.help} [env {spec.variable}].")
        else:
            group.addoption(spec.flag, dest=spec.dest, type=spec.parse, default=None,
                            metavar=spec.metavar, help=f"{spec.help} [env {spec.variable}].")


def _value(config: pytest.Config, spec: OptionSpec, environ: Mapping[str, str]) -> object:
    given = config.getoption(spec.dest)
    if given is not None:
        return given
    raw = environ.get(spec.variable, "")
    if raw == "":
        return None
    try:
        return spec.parse_variable(raw)
    except argparse.ArgumentTypeError as exc:
        raise pytest.UsageError(
            f"{spec.variable}={raw!r}: {exc} (the variable stands in for {spec.flag}; fix "
            "or unset it)") from None


def _typed(value: object, kind: type[_T]) -> _T | None:
    return value if isinstance(value, kind) else None


@dataclass(frozen=True)
class HarnessOptions:
    """The ``--harness-*`` options of a session, each from its flag or its variable."""

    build: str | None = None
    require_gpu: Backend | None = None
    #: The devices of ``require_gpu`` the run needs (``--harness-require-gpu=cuda:2``).
    require_gpu_count: int = 1
    require_features: bool = False
    runner: str = "subprocess"
    image: str | None = None
    server_bin: str | None = None
    source: str | None = None
    run_record: Path | None = None
    threads: int | None = None
    ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S
    planner_gpu: GpuInfo | None = None
    external_server: str | None = None
    known_flakes: str | None = None
    bundles: Path | None = None

    @classmethod
    def from_config(cls, config: pytest.Config,
                    environ: Mapping[str, str] | None = None) -> HarnessOptions:
        """Raises pytest.UsageError naming the variable for a bad ``HARNESS_*`` value."""
        env = os.environ if environ is None else environ
        values = {spec.name: _value(config, spec, env) for spec in OPTIONS}
        required = _typed(values["require_gpu"], GpuRequirement)
        record = _typed(values["run_record"], str)
        timeout = _typed(values["ready_timeout"], float)
        bundles = _typed(values["bundles"], str)
        return cls(
            build=_typed(values["build"], str) or None,
            require_gpu=required.backend if required else None,
            require_gpu_count=required.count if required else 1,
            require_features=_typed(values["require_features"], bool) or False,
            runner=_typed(values["runner"], str) or "subprocess",
            image=_typed(values["image"], str) or None,
            server_bin=_typed(values["server_bin"], str) or None,
            source=_typed(values["source"], str) or None,
            run_record=Path(record).resolve() if record else None,
            threads=_typed(values["threads"], int),
            ready_timeout_s=timeout if timeout is not None else DEFAULT_READY_TIMEOUT_S,
            planner_gpu=_typed(values["planner_gpu"], GpuInfo),
            external_server=_typed(values["external_server"], str) or None,
            known_flakes=_typed(values["known_flakes"], str) or None,
            bundles=Path(bundles).expanduser().resolve() if bundles else None,
        )

    @property
    def names_a_build(self) -> bool:
        """A build or binary was given, so resolving it is cheap and builds nothing."""
        return bool(self.build or self.server_bin)


SESSION_KEY = pytest.StashKey["HarnessSession"]()


@dataclass
class HarnessSession:
    """What a session's options resolve to, each resolved once and only when asked."""

    options: HarnessOptions
    _build: BuildUnderTest | None = field(default=None, init=False)
    _devices: tuple[Device, ...] | None = field(default=None, init=False)
    _launch_env: tuple[RocmLaunchEnv | None] | None = field(default=None, init=False)
    _docker_checked: bool = field(default=False, init=False)
    _docker_missing: str | None = field(default=None, init=False)
    _user_bundles: Mapping[str, Bundle] | None = field(default=None, init=False)

    @classmethod
    def of(cls, config: pytest.Config) -> HarnessSession:
        """The session ``harness.plugin`` made for ``config``."""
        return config.stash[SESSION_KEY]

    # -- the build under test ---------------------------------------------------------

    def build(self) -> BuildUnderTest:
        """The build this run gates, resolved once (building the CPU default if needed).

        Raises pytest.UsageError naming the option and the fix when it cannot be had.
        """
        if self._build is None:
            self._build = self._resolve_build()
        return self._build

    @property
    def resolved_build(self) -> BuildUnderTest | None:
        """The build, only once something resolved it: a unit-test run must not build
        llama-server just to label its results."""
        return self._build

    def _resolve_build(self) -> BuildUnderTest:
        cache = cache_root()
        options = self.options
        try:
            if options.build:
                return resolve_named_build(options.build, cache)
            if options.server_bin:
                return resolve_named_build(options.server_bin, cache,
                                           option="--harness-server-bin")
            source = Path(options.source) if options.source else None
            # A tree of the user's own may predate the RPC server: built plain, and the
            # multi-device suite skips naming what the build lacks.
            request = SUITE_BUILD if source is None else BuildRequest()
            return from_result(ensure_build(cache, request, source))
        except HarnessError as exc:
            raise pytest.UsageError(f"no build under test: {exc}") from exc

    def capabilities(self) -> Capabilities:
        """What the build under test accepts (its ``--help``). Unknown — every launch is
        trusted — with an external server, which is sent nothing (and nothing is built)."""
        if self.options.external_server:
            return Capabilities()
        info = self.build().info
        return info.capabilities if info is not None else Capabilities()

    def header_lines(self) -> list[str]:
        """The session header's line naming the build and its llama.cpp release, once the
        build is resolved (a run naming one resolves it at session start; a unit-test run
        builds nothing to say it)."""
        build = self._build
        if build is None or build.info is None:
            return []
        info = build.info
        return [f"harness build: {info.key} ({info.backend.value}), llama.cpp release "
                f"{info.release}"]

    def run_image(self) -> str | None:
        """The image servers of this run start from, when they run in containers."""
        return run_image(self.build(), self.options.runner, self.options.image)

    # -- what the build sees ----------------------------------------------------------

    def devices(self) -> tuple[Device, ...]:
        """The GPU devices the build under test sees (``--list-devices``), listed once.

        A container run asks the server inside its image, with the GPU access its servers
        get: a container build's binary exists only in the image.
        """
        if self._devices is None:
            image = self.run_image()
            planned = self.launch_env()
            extra = dict(planned.environment) if planned is not None else {}
            self._devices = devices_seen(self.build(), image, extra)
        return self._devices

    def launch_env(self) -> RocmLaunchEnv | None:
        """A ROCm build's launch environment (``harness.planning.rocm_env``), planned once
        from its own device probe and applied to every launch and to ``devices``; None
        for other builds and for an external server, which is not launched here."""
        if self._launch_env is None:
            self._launch_env = (None if self.options.external_server else
                                plan_launch_env(self.build(), self.run_image()),)
        return self._launch_env[0]

    # -- the bundles the suites run over ----------------------------------------------

    def user_bundles(self) -> Mapping[str, Bundle]:
        """``--harness-bundles``' bundles by id (``user:<folder>``), read once; empty
        without the option. Raises pytest.UsageError listing every problem."""
        if self._user_bundles is None:
            folder = self.options.bundles
            try:
                self._user_bundles = load_bundle_folder(folder) if folder else {}
            except HarnessError as exc:
                raise pytest.UsageError(f"--harness-bundles: {exc}") from exc
        return self._user_bundles

    def bundle_names(self) -> tuple[str, ...]:
        """What a suite parametrized over bundles runs over: the fixture bundles, then
        the user's."""
        return (*modelgen.BUNDLE_NAMES, *self.user_bundles())

    def docker_missing(self) -> str | None:
        """Why no Docker engine answers (asked once); None when one does."""
        if not self._docker_checked:
            self._docker_missing = engine_unavailable()
            self._docker_checked = True
        return self._docker_missing
