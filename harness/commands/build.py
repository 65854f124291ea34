"""``harness build``: llama-server from the pinned source (or a checkout), natively or as an
image, cached by everything that goes into it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from harness.builds.container_build import LOCAL
from harness.commands._build_options import build_options, build_request
from harness.commands._progress import build_image_with_progress, build_with_progress
from harness.planning.container_plan import IMAGE_ARGS


@click.command("build")
@build_options
@click.option("--source", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=lambda: os.environ.get("HARNESS_SOURCE") or None,
              help="A local llama.cpp checkout or fork to build instead of the pinned source "
                   "[env HARNESS_SOURCE].")
@click.option("--container", is_flag=True,
              help="Build an image (ci/docker/<backend>.Dockerfile) instead "
                   "of a native binary.")
@click.option("--base", "bases", multiple=True, metavar="ARG=IMAGE",
              help="With --container: BUILD_BASE=IMAGE or RUNTIME_BASE=IMAGE (repeatable), "
                   "or `local`: both stages from the backend's local Debian base (made by "
                   "debootstrap when missing; CUDA and ROCm then install Debian's toolkits). "
                   "Default: the Dockerfile's bases if the engine has them, else local.")
def build_command(*, backend: str, source: Path | None, native: bool, cmake_args: tuple[str, ...],
          cuda_archs: str, amdgpu_targets: str, reduced: bool, rpc: bool, container: bool,
          bases: tuple[str, ...]) -> None:
    """Build llama-server (cached by source, backend, flags and compiler or base images)."""
    request = build_request(backend=backend, native=native, cmake_args=cmake_args,
                            cuda_archs=cuda_archs, amdgpu_targets=amdgpu_targets,
                            reduced=reduced, rpc=rpc)
    if container and rpc:
        raise click.UsageError("--rpc builds the RPC server as a native binary beside "
                               "llama-server; images do not ship one: drop --container")
    if container:
        click.echo(build_image_with_progress(request, source, _parse_bases(bases)).image)
        return
    if bases:
        raise click.UsageError("--base goes with --container")
    result = build_with_progress(request, source)
    click.echo(result.info.binary)


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
