"""The per-backend Dockerfiles in ci/docker/, their parser, and the build
args the harness passes.

Nothing here runs Docker. Each Dockerfile is parsed (``dockerfile_parser``, beside this file) and
its CMake configure call, expanded with the build args ``container_build_args`` returns,
is compared with the native build's ``BuildRequest.cmake_flags()``: the check that a
container build and a native build of one request cannot drift apart.
"""

from __future__ import annotations

import re

import pytest
from dockerfile_parser import Dockerfile, parse_dockerfile
from shell_commands import ShellCommand

from harness.builds.dockerfile import dockerfile_path
from harness.builds.source import load_manifest
from harness.errors import BuildError, ConfigError
from harness.facts.build import Backend
from harness.planning.build_plan import SERVER_TARGET, BuildRequest
from harness.planning.container_plan import (
    CMAKE_FLAGS_ARG,
    DEFAULT_BASES,
    IMAGE_ARGS,
    SERVER_PATH_IN_IMAGE,
    build_arg_argv,
    cmake_flags_from_build_arg,
    container_build_args,
)

BACKENDS = list(Backend)

#: The images a runner with registry access builds from, following llama.cpp's .devops
#: practice; Debian 13 for CPU and Vulkan (Vulkan does not build on Debian 12's headers).
EXPECTED_IMAGES = [
    (Backend.CPU, "debian:trixie-slim",
     "debian:trixie-slim"),
    (Backend.CUDA, "nvidia/cuda:12.8.1-devel-ubuntu24.04",
     "nvidia/cuda:12.8.1-runtime-ubuntu24.04"),
    (Backend.ROCM, "rocm/dev-ubuntu-24.04:7.2.1-complete",
     "rocm/dev-ubuntu-24.04:7.2.1-complete"),
    (Backend.VULKAN, "debian:trixie-slim",
     "debian:trixie-slim"),
]

#: What each stage installs with apt: kept to the minimum, every name in Debian's archive.
#: The CUDA and ROCm toolkits and libraries are installed only with TOOLKIT=debian (a
#: local Debian base); the parser lists every apt call, guarded or not.
EXPECTED_PACKAGES = [
    (Backend.CPU, {"build-essential", "cmake"}, {"libgomp1"}),
    (Backend.CUDA, {"build-essential", "cmake", "nvidia-cuda-toolkit", "nvidia-cuda-toolkit-gcc"},
     {"libgomp1", "libcudart12", "libcublas12", "libcublaslt12"}),
    (Backend.ROCM, {"build-essential", "cmake", "hipcc", "libamdhip64-dev", "libhipblas-dev",
                    "librocblas-dev", "rocm-cmake"},
     {"libgomp1", "libamdhip64-6", "libhipblas2", "librocblas4"}),
    (Backend.VULKAN, {"build-essential", "cmake", "glslc", "libvulkan-dev", "spirv-headers"},
     {"libgomp1", "libvulkan1", "mesa-vulkan-drivers"}),
]

#: The environment a configure call may run with: only the choice of the HIP compiler and
#: the GPU targets a GPU-less build reports (ROCm). Anything else (CFLAGS, LDFLAGS, CC…)
#: would change the build behind the flags' back.
ALLOWED_CMAKE_ENV = {
    Backend.CPU: set(),
    Backend.CUDA: {"CUDAHOSTCXX"},
    Backend.ROCM: {"HIPCXX", "HIP_PATH", "ROCM_TARGET_LST"},
    Backend.VULKAN: set(),
}


def _requests(backend: Backend) -> list[BuildRequest]:
    native = BuildRequest(backend=backend, native=True,
                          extra_cmake_args=("-DCMAKE_CUDA_ARCHITECTURES=86;89",)
                          if backend is Backend.CUDA else ())
    return [BuildRequest(backend=backend), native,
            BuildRequest(backend=backend, extra_cmake_args=("-DGGML_SCHED_MAX_COPIES=2",
                                                            "-D", "LLAMA_FATAL_WARNINGS=OFF"))]


REQUESTS = [pytest.param(request, id=f"{request.backend}-{label}")
            for backend in BACKENDS
            for request, label in zip(_requests(backend), ("default", "native", "extra-args"),
                                      strict=True)]


def _dockerfile(backend: Backend) -> Dockerfile:
    return parse_dockerfile(dockerfile_path(backend).read_text())


def _args(backend: Backend) -> dict[str, str]:
    return container_build_args(backend, BuildRequest(backend=backend), None)


def _apt_packages(commands: tuple[ShellCommand, ...], stage: str) -> set[str]:
    return {word for cmd in commands if cmd.stage == stage and cmd.argv[:2] == (
        "apt-get", "install") for word in cmd.argv[2:] if not word.startswith("-")}


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_dockerfile_exists_parses_and_documents_its_build_args(backend: Backend) -> None:
    path = dockerfile_path(backend)
    assert path.is_file(), f"{path} is missing"
    text = path.read_text()
    dockerfile = parse_dockerfile(text)
    header = "\n".join(re.findall(r"^#.*$", text.split("\nARG ", 1)[0], flags=re.MULTILINE))
    assert "llama-server" in header
    declared = {arg.name for arg in dockerfile.global_args} | {
        arg.name for stage in dockerfile.stages for arg in stage.args}
    for name in declared:
        assert re.search(rf"^#\s+{name}\s", header, flags=re.MULTILINE), \
            f"{path.name}: build arg {name} is not described in the comment header"


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_has_a_build_and_a_runtime_stage_runtime_last(backend: Backend) -> None:
    # The runtime stage comes last so that a plain `docker build` produces it.
    assert [stage.name for stage in _dockerfile(backend).stages] == ["build", "runtime"]


@pytest.mark.parametrize(("backend", "build_image", "runtime_image"), EXPECTED_IMAGES,
                         ids=[str(row[0]) for row in EXPECTED_IMAGES])
def test_images_are_build_args_with_the_expected_defaults(
        backend: Backend, build_image: str, runtime_image: str) -> None:
    dockerfile = _dockerfile(backend)
    assert dockerfile.stage("build").base == "${BUILD_BASE}"
    assert dockerfile.stage("runtime").base == "${RUNTIME_BASE}"
    defaults = dockerfile.arg_defaults()
    assert defaults["BUILD_BASE"] == build_image
    assert defaults["RUNTIME_BASE"] == runtime_image
    assert dict(DEFAULT_BASES[backend]) == {"BUILD_BASE": build_image,
                                           "RUNTIME_BASE": runtime_image}


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_locally_made_bases_reach_from(backend: Backend) -> None:
    dockerfile = _dockerfile(backend)
    args = container_build_args(backend, BuildRequest(backend=backend),
                                {"BUILD_BASE": "local/trixie:build",
                                 "RUNTIME_BASE": "local/trixie:run"})
    assert dockerfile.base_image(dockerfile.stage("build"), args) == "local/trixie:build"
    assert dockerfile.base_image(dockerfile.stage("runtime"), args) == "local/trixie:run"


@pytest.mark.parametrize("request_", REQUESTS)
def test_cmake_gets_exactly_the_native_builds_flags(request_: BuildRequest) -> None:
    backend = request_.backend
    args = container_build_args(backend, request_, None)
    configure = _dockerfile(backend).cmake_configure(args)
    native = request_.cmake_flags()
    assert cmake_flags_from_build_arg(args[CMAKE_FLAGS_ARG]) == native
    assert configure.other == (), "cmake gets arguments the native build does not pass"
    # Word for word and in order, as the native build's configure_argv passes them (it
    # adds only -G, the generator, which changes how the build runs, not what it makes).
    assert configure.argv == ("-S", "/src", "-B", "/build", *native)
    assert {name for name, _ in configure.assignments} <= ALLOWED_CMAKE_ENV[backend]


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_build_stage_sets_no_environment_that_steers_the_compiler(backend: Backend) -> None:
    assert _dockerfile(backend).stage("build").env_names == ()


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_cmake_flags_have_no_default_and_a_build_without_them_stops(backend: Backend) -> None:
    dockerfile = _dockerfile(backend)
    (flags_arg,) = [arg for arg in dockerfile.stage("build").args if arg.name == CMAKE_FLAGS_ARG]
    assert flags_arg.default is None, "the flags must come from BuildRequest.cmake_flags() only"
    commands = [cmd.argv for cmd in dockerfile.commands() if cmd.stage == "build"]
    guard = next(i for i, argv in enumerate(commands)
                 if argv[:1] == (":",) and argv[1].startswith("${CMAKE_FLAGS:?"))
    configure = next(i for i, argv in enumerate(commands)
                     if argv[:1] == ("cmake",) and "--build" not in argv)
    assert guard < configure
    # Unset, the flags stay visible as the unexpanded name instead of vanishing.
    assert dockerfile.cmake_configure().other == ("${CMAKE_FLAGS}",)


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_builds_only_the_llama_server_target(backend: Backend) -> None:
    dockerfile = _dockerfile(backend)
    args = _args(backend)
    builds = dockerfile.cmake_builds(args)
    assert builds, "no cmake --build call"
    assert all(build.targets == (SERVER_TARGET,) for build in builds)
    assert all(build.build_dir == "/build" for build in builds)
    assert dockerfile.cmake_configure(args).build_dir == "/build"
    assert not [cmd.argv for cmd in dockerfile.commands(args)
                if cmd.argv[:1] in (("make",), ("ninja",))], "a build around cmake --build"


def _downloads(argv: tuple[str, ...]) -> bool:
    words = [word for word in argv if not word.startswith("-")]
    return (argv[:1] in (("curl",), ("wget",)) or words[:2] == ["git", "clone"]
            or (bool(words) and words[0] in ("pip", "pip3") and "download" in words)
            or words[:4] == ["python3", "-m", "pip", "download"])


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_source_comes_from_the_build_context_never_downloaded(backend: Backend) -> None:
    dockerfile = _dockerfile(backend)
    args = _args(backend)
    fetching = [cmd.argv for cmd in dockerfile.commands(args) if _downloads(cmd.argv)]
    assert not fetching, f"the build downloads: {fetching}"
    copies = dockerfile.copies(args)
    assert not [c for c in copies if c.keyword == "ADD"], "ADD may fetch URLs; use COPY"
    (source,) = [c for c in copies if c.stage == "build"]
    # The build context is the source cache entry, which holds the tree under this name.
    assert source.from_stage is None
    assert source.sources == (load_manifest().tree,)
    assert source.destination == "/src"
    for stage in dockerfile.stages:
        for ins in stage.instructions:
            assert not re.search(r"(https?|git|ftp)://|git@", ins.value), \
                f"{dockerfile_path(backend).name} line {ins.line} names a URL"


@pytest.mark.parametrize("backend", BACKENDS, ids=str)
def test_runtime_stage_holds_only_the_server_and_runs_it(backend: Backend) -> None:
    dockerfile = _dockerfile(backend)
    runtime = dockerfile.stage("runtime")
    copy, *others = runtime.copies
    # The CUDA image also keeps the toolkit's driver stub, outside the loader's path.
    assert [c.sources for c in others] == ([("/opt/harness/cuda-stub",)]
                                           if backend is Backend.CUDA else [])
    assert copy.from_stage == "build"
    assert copy.sources == ("/build/bin/llama-server",)
    assert copy.destination == SERVER_PATH_IN_IMAGE
    assert runtime.entrypoint == (SERVER_PATH_IN_IMAGE,)
    # The image build fails when the binary needs a library the image lacks.
    assert ("ldd", SERVER_PATH_IN_IMAGE) in [
        cmd.argv for cmd in dockerfile.commands() if cmd.stage == "runtime"]


@pytest.mark.parametrize(("backend", "build_packages", "runtime_packages"), EXPECTED_PACKAGES,
                         ids=[str(row[0]) for row in EXPECTED_PACKAGES])
def test_apt_installs_are_minimal(backend: Backend, build_packages: set[str],
                                  runtime_packages: set[str]) -> None:
    commands = _dockerfile(backend).commands(_args(backend))
    assert _apt_packages(commands, "build") == build_packages
    assert _apt_packages(commands, "runtime") == runtime_packages
    assert all("--no-install-recommends" in cmd.argv for cmd in commands
               if cmd.argv[:2] == ("apt-get", "install"))


# --- container_build_args ------------------------------------------------------------


def test_build_args_are_the_images_and_the_requests_flags() -> None:
    request = BuildRequest(backend=Backend.VULKAN)
    args = container_build_args(Backend.VULKAN, request, None)
    assert set(args) == {*IMAGE_ARGS, CMAKE_FLAGS_ARG}
    assert args[CMAKE_FLAGS_ARG] == " ".join(request.cmake_flags())
    assert args[CMAKE_FLAGS_ARG].endswith("-DGGML_NATIVE=OFF -DGGML_VULKAN=ON")


def test_one_base_can_be_overridden_alone() -> None:
    args = container_build_args(Backend.CPU, BuildRequest(), {"BUILD_BASE": "local/trixie"})
    assert args["BUILD_BASE"] == "local/trixie"
    assert args["RUNTIME_BASE"] == DEFAULT_BASES[Backend.CPU]["RUNTIME_BASE"]


@pytest.mark.parametrize("key", ["CMAKE_FLAGS", "BASE_IMAGE"], ids=str)
def test_unknown_base_keys_are_refused_with_the_allowed_set(key: str) -> None:
    with pytest.raises(ConfigError, match=rf"unknown base image argument '{key}'; "
                                          r"allowed: BUILD_BASE, RUNTIME_BASE"):
        container_build_args(Backend.CPU, BuildRequest(), {key: "x"})


@pytest.mark.parametrize("image", ["", "debian trixie"], ids=["empty", "space"])
def test_unusable_image_references_are_refused(image: str) -> None:
    with pytest.raises(ConfigError, match="RUNTIME_BASE"):
        container_build_args(Backend.CPU, BuildRequest(), {"RUNTIME_BASE": image})


def test_request_for_another_backend_is_refused() -> None:
    with pytest.raises(ConfigError, match="'cuda' but the container build is for 'rocm'"):
        container_build_args(Backend.ROCM, BuildRequest(backend=Backend.CUDA), None)


def test_a_flag_with_whitespace_is_refused() -> None:
    request = BuildRequest(extra_cmake_args=("-DCMAKE_C_FLAGS=-O2 -g",))
    with pytest.raises(ConfigError, match="holds whitespace"):
        container_build_args(Backend.CPU, request, None)


def test_native_cuda_needs_named_architectures() -> None:
    with pytest.raises(ConfigError, match="CMAKE_CUDA_ARCHITECTURES"):
        container_build_args(Backend.CUDA, BuildRequest(backend=Backend.CUDA, native=True),
                             None)
    named = BuildRequest(backend=Backend.CUDA, native=True,
                         extra_cmake_args=("-DCMAKE_CUDA_ARCHITECTURES=86;89",))
    flags = container_build_args(Backend.CUDA, named, None)[CMAKE_FLAGS_ARG]
    assert flags.endswith("-DCMAKE_CUDA_ARCHITECTURES=86;89")


def test_build_arg_argv_is_sorted_pairs() -> None:
    assert build_arg_argv({"RUNTIME_BASE": "r", "BUILD_BASE": "b"}) == [
        "--build-arg", "BUILD_BASE=b", "--build-arg", "RUNTIME_BASE=r"]


# --- the parser bites: the checks above would catch these -----------------------------

_TEMPLATE = """\
ARG BUILD_BASE=debian
FROM ${{BUILD_BASE}} AS build
ARG CMAKE_FLAGS
RUN set -f && {configure} && cmake --build /b --target llama-server
FROM debian AS runtime
COPY --from=build /b/bin/llama-server /app/llama-server
ENTRYPOINT ["/app/llama-server"]
"""
_FLAGS = {"CMAKE_FLAGS": "-DA=1 -DB=2"}


@pytest.mark.parametrize(("configure", "definitions", "other"), [
    ("cmake -S /s -B /b ${CMAKE_FLAGS}", ("-DA=1", "-DB=2"), ()),
    ("cmake -S /s -B /b $CMAKE_FLAGS", ("-DA=1", "-DB=2"), ()),
    ("cmake -S /s -B /b -DGGML_CUDA=ON ${CMAKE_FLAGS}", ("-DGGML_CUDA=ON", "-DA=1", "-DB=2"),
     ()),
    ('cmake -S /s -B /b "${CMAKE_FLAGS}"', ("-DA=1 -DB=2",), ()),
    ("cmake -S /s -B /b '${CMAKE_FLAGS}'", (), ("${CMAKE_FLAGS}",)),
    ("cmake -S /s -B /b -G Ninja -D X=1 ${CMAKE_FLAGS}", ("-DX=1", "-DA=1", "-DB=2"),
     ("-G", "Ninja")),
    ("CFLAGS=-O0 cmake -S /s -B /b ${CMAKE_FLAGS}", ("-DA=1", "-DB=2"), ()),
], ids=["braced", "bare", "added-flag", "double-quoted-one-word", "single-quoted-literal",
        "generator-and-split-D", "env-prefix"])
def test_parser_reports_the_flags_as_the_shell_passes_them(
        configure: str, definitions: tuple[str, ...], other: tuple[str, ...]) -> None:
    call = parse_dockerfile(_TEMPLATE.format(configure=configure)).cmake_configure(_FLAGS)
    assert call.definitions == definitions
    assert call.other == other
    assert call.source == "/s"
    assert call.build_dir == "/b"


def test_parser_keeps_env_prefixes_of_the_configure_call() -> None:
    text = _TEMPLATE.format(configure='CFLAGS="-O0 -g" cmake -S /s -B /b ${CMAKE_FLAGS}')
    assert parse_dockerfile(text).cmake_configure(_FLAGS).assignments == (("CFLAGS", "-O0 -g"),)


def test_a_global_arg_is_not_seen_by_a_stage_that_does_not_declare_it() -> None:
    text = _TEMPLATE.replace("ARG CMAKE_FLAGS\n", "").replace(
        "ARG BUILD_BASE=debian", "ARG BUILD_BASE=debian\nARG CMAKE_FLAGS")
    call = parse_dockerfile(text.format(configure="cmake -S /s -B /b ${CMAKE_FLAGS}"))
    assert call.cmake_configure(_FLAGS).other == ("${CMAKE_FLAGS}",)


def test_quoted_operators_and_continuations_stay_inside_their_command() -> None:
    text = ("FROM debian AS build\n"
            "ARG T=\"a;b\"\n"
            "# a comment inside the continuation is dropped, as Docker does\n"
            "RUN echo \"$T\" | tr ';' '\\n' > /t.lst \\\n"
            "# dropped\n"
            "    && X=\"$(nproc; true)\" make -j2 >&2\n")
    argvs = [(cmd.assignments, cmd.argv) for cmd in parse_dockerfile(text).commands()]
    assert argvs == [((), ("echo", "a;b")), ((), ("tr", ";", "\\n", ">", "/t.lst")),
                     ((("X", "$(nproc; true)"),), ("make", "-j2", ">&2"))]


def test_cmake_build_without_a_target_builds_everything() -> None:
    text = _TEMPLATE.format(configure="cmake -S /s -B /b").replace(
        "--target llama-server", "-j 2")
    (build,) = parse_dockerfile(text).cmake_builds()
    assert build.targets == ()


def test_two_configure_calls_are_an_error_naming_both_lines() -> None:
    text = _TEMPLATE.format(configure="cmake -S /s -B /b && cmake -S /s -B /c")
    with pytest.raises(BuildError, match=r"found 2 \(line 4, line 4\)"):
        parse_dockerfile(text).cmake_configure()


@pytest.mark.parametrize("text", ["RUN true\nFROM debian\n", "# only a comment\n",
                                  "FROM a b c d\n"], ids=["run-before-from", "no-from",
                                                          "bad-from"])
def test_unreadable_dockerfiles_are_refused(text: str) -> None:
    with pytest.raises(BuildError, match="Dockerfile"):
        parse_dockerfile(text)


def test_stage_lookup_names_the_stages_there_are() -> None:
    dockerfile = parse_dockerfile(_TEMPLATE.format(configure="cmake -S /s -B /b"))
    with pytest.raises(BuildError, match="no stage named 'server'; its stages: build, runtime"):
        dockerfile.stage("server")
