"""``harness build``: llama-server from the pinned source (or a checkout), natively or as an
image, cached by everything that goes into it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from harness.builds.container_build import LOCAL
from harness.commands._progress import build_image_with_progress, build_with_progress
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest
from harness.planning.container_plan import IMAGE_ARGS


@click.command("build")
@click.option("--backend", type=click.Choice([b.value for b in Backend]), default="cpu",
              show_default=True, help="ggml backend to build.")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=lambda: os.environ.get("HARNESS_SOURCE") or None,
              help="A local llama.cpp checkout or fork to build instead of the pinned source "
                   "[env HARNESS_SOURCE].")
@click.option("--native/--portable", default=False, show_default=True,
              help="GGML_NATIVE: tune for this CPU (not portable to other machines).")
@click.option("--cmake-arg", "cmake_args", multiple=True,
              help="Extra -D flag for CMake; repeatable; part of the build key.")
@click.option("--cuda-arch", "cuda_archs", default="", metavar="ARCHS",
              help="CUDA: compute capabilities to compile, comma separated (e.g. 90 or 89,90; "
                   "default: ggml's portable list; --reduced: 90).")
@click.option("--amdgpu-targets", "amdgpu_targets", default="", metavar="TARGETS",
              help="ROCm: gfx targets to compile, comma separated (e.g. gfx1100; default: the "
                   "GPUs present natively, the Dockerfile's list in a container; --reduced: "
                   "gfx1100).")
@click.option("--reduced", is_flag=True,
              help="CUDA/ROCm: the reduced variant CI builds — one architecture, no "
                   "FlashAttention kernels; named in the build key.")
@click.option("--container", is_flag=True,
              help="Build an image (ci/docker/<backend>.Dockerfile) instead "
                   "of a native binary.")
@click.option("--base", "bases", multiple=True, metavar="ARG=IMAGE",
              help="With --container: BUILD_BASE=IMAGE or RUNTIME_BASE=IMAGE (repeatable), "
                   "or `local`: both stages from the backend's local Debian base (made by "
                   "debootstrap when missing; CUDA and ROCm then install Debian's toolkits). "
                   "Default: the Dockerfile's bases if the engine has them, else local.")
def build_command(*, backend: str, source: Path | None, native: bool, cmake_args: tuple[str, ...],
          cuda_archs: str, amdgpu_targets: str, reduced: bool, container: bool,
          bases: tuple[str, ...]) -> None:
    """Build llama-server (cached by source, backend, flags and compiler or base images)."""
    chosen = Backend(backend)
    archs = _gpu_archs(chosen, cuda_archs, amdgpu_targets)
    try:
        request = BuildRequest(backend=chosen, native=native, extra_cmake_args=cmake_args,
                               gpu_archs=archs, reduced=reduced)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if container:
        click.echo(build_image_with_progress(request, source, _parse_bases(bases)).image)
        return
    if bases:
        raise click.UsageError("--base goes with --container")
    result = build_with_progress(request, source)
    click.echo(result.info.binary)


def _gpu_archs(backend: Backend, cuda_archs: str, amdgpu_targets: str) -> tuple[str, ...]:
    """The architecture option that belongs to ``backend``; the other one is an error."""
    for option, value, owner in (("--cuda-arch", cuda_archs, Backend.CUDA),
                                 ("--amdgpu-targets", amdgpu_targets, Backend.ROCM)):
        if value and backend is not owner:
            raise click.UsageError(f"{option} is for --backend {owner.value}, "
                                   f"not {backend.value}")
    chosen = cuda_archs if backend is Backend.CUDA else amdgpu_targets
    return tuple(part.strip() for part in chosen.split(",") if part.strip())


def _parse_bases(bases: tuple[str, ...]) -> dict[str, str]:
    parsed = {}
    for item in bases:
        if item == LOCAL:
            parsed.update(dict.fromkeys(IMAGE_ARGS, LOCAL))
            continue
        arg, sep, image = item.partition("=")
        if not sep or not image:
            raise click.BadParameter(f"{item!r} is not ARG=IMAGE", param_hint="--base")
        parsed[arg] = image
    return parsed
