"""``harness build --container``: llama-server images built through the Docker SDK.

The build context is a tar the harness writes itself: the backend's Dockerfile and the
source tree under ``llama.cpp/`` (so a local checkout anywhere on disk works, and
``.git`` and top-level ``build*`` directories stay out). The build runs with host
networking; CMake flags come from the same ``BuildRequest`` as a native build. Where a
configured base image is not present (no registry is reachable here), the local Debian
base from ``harness base-image`` is used for Debian-based images.

The image is tagged ``harness/llama-server:<key>``, where the key hashes the source,
backend, flags and the base images' ids. Its ``build.json`` (capabilities from the
image's own ``llama-server --help``) is stored in the cache beside native builds and as
the label ``org.llama-harness.build`` on the final image.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import tarfile
import tempfile
import threading
import time
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests
import urllib3
from docker.errors import APIError, ImageNotFound
from docker.errors import BuildError as DockerBuildError
from docker.types.daemon import CancellableStream

from harness.bounded import bounded_lock
from harness.builds.base_image import ensure_base_image
from harness.builds.capabilities import parse_capabilities
from harness.builds.dockerfile import dockerfile_path
from harness.builds.native import (
    LOG_TAIL_LINES,
    ProgressCallback,
    builds_dir,
    progress_fraction,
    read_build_info,
)
from harness.builds.resolve import resolve_source
from harness.builds.source import SourceTree, load_manifest
from harness.errors import BuildError
from harness.facts.build import Backend, BuildInfo
from harness.files import write_json_atomic
from harness.paths import cache_root
from harness.planning.build_plan import BuildRequest, build_key
from harness.planning.container_plan import (
    DEFAULT_BASES,
    IMAGE_ARGS,
    LOCAL_BASES,
    PROBE_ENVIRONMENT,
    SERVER_PATH_IN_IMAGE,
    container_build_args,
)
from harness.probes.docker_engine import docker_engine

IMAGE_REPOSITORY = "harness/llama-server"
BUILD_LABEL = "org.llama-harness.build"
KEY_LABEL = "org.llama-harness.build-key"
#: The word ``--base`` takes for the backend's local Debian base.
LOCAL = "local"
_SKIPPED_TOP = (".git", "build")
#: Seconds one image build may take: minutes for the CPU image, an hour or more for
#: CUDA or ROCm with every architecture. Generous, but finite.
IMAGE_BUILD_LIMIT_S = 4 * 3600.0
#: Seconds ``llama-server --version`` or ``--help`` may take in the built image, and the
#: one-line label build after it.
PROBE_LIMIT_S = 120.0
#: Seconds a caller waits for another process building the same image: its build, which
#: that process gives up on by then, plus the probes and the label.
IMAGE_LOCK_WAIT_S = IMAGE_BUILD_LIMIT_S + 600.0


@dataclass(frozen=True)
class ContainerBuild:
    info: BuildInfo
    directory: Path
    cache_hit: bool


def build_image(client: Any, cache: Path, source: SourceTree, request: BuildRequest, *,
                bases: Mapping[str, str] | None = None,
                progress: ProgressCallback | None = None) -> ContainerBuild:
    """The image for these inputs, built now unless the engine already has it."""
    chosen, local = resolve_bases(client, cache, request.backend, bases)
    base_ids = [image_id(client, chosen[arg]) for arg in IMAGE_ARGS]
    args = container_build_args(request.backend, request, chosen, local_base=local)
    key = build_key(source.digest, request,
                    container_recipe(dockerfile_path(request.backend).read_bytes(), args,
                                     base_ids))
    tag = f"{IMAGE_REPOSITORY}:{key}"
    directory = builds_dir(cache) / key
    hit = _finished(client, directory, tag)
    if hit:
        return hit
    directory.mkdir(parents=True, exist_ok=True)
    with bounded_lock(Path(str(directory) + ".lock"), wait_s=IMAGE_LOCK_WAIT_S,
                      purpose=f"building the image {tag}", error=BuildError,
                      setting="harness.builds.container_build.IMAGE_LOCK_WAIT_S"):
        hit = _finished(client, directory, tag)
        if hit:
            return hit
        started = time.monotonic()
        _run_build(client, directory, source, request.backend, args=args, tag=f"{tag}-stage",
                   progress=progress)
        info = BuildInfo(
            key=key, backend=request.backend, binary=SERVER_PATH_IN_IMAGE,
            version=_run_in_image(client, f"{tag}-stage", "--version", request.backend),
            source_digest=source.digest, source_origin=source.origin,
            cmake_flags=request.cmake_flags(), compiler="container:" + ",".join(base_ids),
            build_seconds=round(time.monotonic() - started, 1),
            capabilities=parse_capabilities(
                _run_in_image(client, f"{tag}-stage", "--help", request.backend)),
            image=tag, base_image_digest=",".join(base_ids),
        )
        _label(client, f"{tag}-stage", tag, info)
        client.images.remove(f"{tag}-stage")
        write_json_atomic(directory / "build.json", info.to_json())
        return ContainerBuild(info, directory, cache_hit=False)


def pinned_source_image(request: BuildRequest) -> BuildInfo:
    """The image of the pinned source for ``request`` on this machine's engine, built when
    missing (a cache hit once ``scripts/test.sh`` made it)."""
    cache = cache_root()
    client = docker_engine()
    try:
        built = build_image(client, cache, resolve_source(cache, None), request)
    finally:
        client.close()
    if built.info.image is None:
        raise BuildError(f"the {request.backend.value} image build recorded no image tag")
    return built.info


def resolve_bases(client: Any, cache: Path, backend: Backend,
                  bases: Mapping[str, str] | None) -> tuple[dict[str, str], bool]:
    """The base images to build from, and whether they are the local Debian base.

    Given images win (``--base ARG=IMAGE``; ``local`` as the image names the local
    base). Without any, the Dockerfile's registry bases are used where the engine has
    them, else every stage builds from the backend's local Debian base, made here by
    debootstrap when missing (``LOCAL_BASES``: trixie with non-free for CUDA, sid for
    ROCm). A given image the engine lacks is an error: no registry is reachable.
    """
    given = dict(bases or {})
    wants_local = set(given.values()) == {LOCAL}
    if given and not wants_local and LOCAL in given.values():
        raise BuildError("--base local names the local Debian base for every stage; give "
                         "either local or images, not both")
    if not given:
        defaults = dict(DEFAULT_BASES[backend])
        if all(_present(client, image) for image in defaults.values()):
            return defaults, False
        wants_local = True
    if wants_local:
        local = LOCAL_BASES[backend]
        tag = ensure_base_image(client, local.distro, cache / "base-images",
                                components=local.components).tag
        return {arg: tag for arg in IMAGE_ARGS}, True
    chosen = {**DEFAULT_BASES[backend], **given}
    for arg, image in chosen.items():
        if not _present(client, image):
            raise BuildError(
                f"base image {image} ({arg}) is not on this Docker engine and no registry "
                "is reachable; load it with `docker load`, pass another base "
                f"(--base {arg}=IMAGE), or build from the local Debian base (--base local)")
    return chosen, False


def container_recipe(dockerfile: bytes, build_args: Mapping[str, str],
                     base_ids: list[str]) -> str:
    """What the build key's "compiler" is for an image: the Dockerfile's bytes, every
    build argument and the base images' ids — a change to any of them is a new image."""
    payload = json.dumps({"dockerfile": hashlib.sha256(dockerfile).hexdigest(),
                          "args": dict(sorted(build_args.items())), "bases": base_ids},
                         sort_keys=True)
    return "container:" + hashlib.sha256(payload.encode()).hexdigest()[:16]


def list_images(client: Any) -> list[BuildInfo]:
    """Every harness-built llama-server image on the engine, newest first."""
    found = []
    for image in client.images.list(filters={"label": KEY_LABEL}):
        label = image.labels.get(BUILD_LABEL)
        if label:
            found.append((image.attrs.get("Created", ""), BuildInfo.from_json(json.loads(label))))
    return [info for _, info in sorted(found, key=lambda item: item[0], reverse=True)]


def image_backend(client: Any, image: str) -> Backend:
    """The backend an image was built for, from its build label (unlabelled: CPU)."""
    label = client.images.get(image).labels.get(BUILD_LABEL)
    return BuildInfo.from_json(json.loads(label)).backend if label else Backend.CPU


def _finished(client: Any, directory: Path, tag: str) -> ContainerBuild | None:
    record = directory / "build.json"
    if not record.is_file() or not _present(client, tag):
        return None
    try:
        return ContainerBuild(read_build_info(record), directory, cache_hit=True)
    except BuildError:
        return None


def _present(client: Any, image: str) -> bool:
    try:
        client.images.get(image)
    except ImageNotFound:
        return False
    return True


def image_id(client: Any, image: str) -> str:
    """The engine's id of ``image`` (the sha256 of its config)."""
    return str(client.images.get(image).id)


def _context(source: SourceTree, backend: Backend) -> io.BytesIO:
    """A tar of the Dockerfile and the source tree under ``llama.cpp/``."""
    buffer = io.BytesIO()
    tree = load_manifest().tree
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        tar.add(dockerfile_path(backend), arcname="Dockerfile")
        for entry in sorted(os.listdir(source.path)):
            if entry.startswith(_SKIPPED_TOP):
                continue
            tar.add(source.path / entry, arcname=f"{tree}/{entry}")
    buffer.seek(0)
    return buffer


def _run_build(client: Any, directory: Path, source: SourceTree, backend: Backend, *,
               args: Mapping[str, str], tag: str, progress: ProgressCallback | None) -> None:
    log_path = directory / "build.log"
    tail: deque[str] = deque(maxlen=LOG_TAIL_LINES)
    error: str | None = None
    limit = IMAGE_BUILD_LIMIT_S
    deadline = time.monotonic() + limit
    with log_path.open("w", encoding="utf-8", buffering=1) as log, _cut_off(client, limit):
        log.write(f"$ docker build --network host --tag {tag} "
                  + " ".join(f"--build-arg {k}={v}" for k, v in args.items()) + "\n")
        try:
            # The timeout bounds the wait for the engine's answer (and each read of it).
            stream = client.api.build(fileobj=_context(source, backend), custom_context=True,
                                      dockerfile="Dockerfile", tag=tag, buildargs=dict(args),
                                      network_mode="host", rm=True, forcerm=True, decode=True,
                                      timeout=limit)
            for chunk in stream:
                text = chunk.get("stream") or chunk.get("status") or ""
                if "error" in chunk:
                    error = str(chunk["error"])
                    text = error + "\n"
                for line in text.splitlines():
                    log.write(line + "\n")
                    tail.append(line)
                    if progress:
                        progress(progress_fraction(line), line)
        except (APIError, DockerBuildError) as exc:
            error = str(exc)
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            error = f"the engine's answer broke off: {exc}"
    lines = "\n".join(tail)
    if time.monotonic() >= deadline:
        raise BuildError(f"the {backend.value} image build did not finish within its limit "
                         f"of {limit:g} s (harness.builds.container_build.IMAGE_BUILD_LIMIT_S); "
                         "it was cancelled by closing its connection to the engine.\n"
                         f"--- last {LOG_TAIL_LINES} lines of the build log ---\n{lines}\n"
                         f"--- full log: {log_path} ---")
    if error is not None:
        raise BuildError(f"the {backend.value} image build failed: {error}\n"
                         f"--- last {LOG_TAIL_LINES} lines of the build log ---\n{lines}\n"
                         f"--- full log: {log_path} ---")


@contextlib.contextmanager
def _cut_off(client: Any, after_s: float) -> Iterator[None]:
    """Close every answer ``client`` receives in the block once ``after_s`` have passed.

    A build streams its output as it goes; a read blocked on a silent, hung step is
    woken by shutting the socket down (docker's own stream cancelling), and the engine
    cancels a build whose client went away.
    """
    answers: list[requests.Response] = []
    lock = threading.Lock()

    def keep(response: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
        with lock:
            answers.append(response)
        return response

    def cut() -> None:
        with lock:
            for response in answers:
                with contextlib.suppress(Exception):  # already closed, or never streamed
                    CancellableStream(None, response).close()

    hooks = client.api.hooks["response"]
    hooks.append(keep)
    timer = threading.Timer(after_s, cut)
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        hooks.remove(keep)


def _run_in_image(client: Any, image: str, flag: str, backend: Backend) -> str:
    # Asked with no GPU: a CUDA binary does not even load without a libcuda.so.1, so it
    # is given the toolkit's driver stub the image keeps (PROBE_ENVIRONMENT).
    container = client.containers.create(image, [flag], network_mode="host",
                                         environment=dict(PROBE_ENVIRONMENT.get(backend, {})))
    try:
        container.start()
        code = container.wait(timeout=PROBE_LIMIT_S).get("StatusCode")
        text = str(container.logs(stdout=True, stderr=True).decode(errors="replace")).strip()
    except requests.RequestException as exc:
        raise BuildError(f"llama-server {flag} in {image} did not finish within "
                         f"{PROBE_LIMIT_S:g} s (harness.builds.container_build.PROBE_LIMIT_S): "
                         f"{exc}") from exc
    finally:
        container.remove(force=True)
    if code != 0 or not text:
        raise BuildError(f"llama-server {flag} in {image} failed with exit code {code}:\n"
                         f"{text[-2000:]}")
    return text


def _label(client: Any, stage: str, tag: str, info: BuildInfo) -> None:
    """Put build.json on the image: a one-instruction build on top of the stage image."""
    record = json.dumps(info.to_json(), sort_keys=True)
    dockerfile = (f"FROM {stage}\nLABEL {KEY_LABEL}={json.dumps(info.key)} "
                  f"{BUILD_LABEL}={json.dumps(record)}\n")
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "Dockerfile").write_text(dockerfile)
        client.images.build(path=tmp, tag=tag, network_mode="host", rm=True,
                            timeout=PROBE_LIMIT_S)
