"""The native build options ``harness build`` and ``harness bisect`` share, and the
request they make."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.planning.build_plan import BuildRequest

F = TypeVar("F", bound=Callable[..., Any])


def build_options(command: F) -> F:
    """Add --backend, --native, --cmake-arg, --cuda-arch, --amdgpu-targets, --reduced,
    --rpc."""
    for option in reversed((
        click.option("--backend", type=click.Choice([b.value for b in Backend]),
                     default="cpu", show_default=True, help="ggml backend to build."),
        click.option("--native/--portable", default=False, show_default=True,
                     help="GGML_NATIVE: tune for this CPU (not portable to other machines)."),
        click.option("--cmake-arg", "cmake_args", multiple=True,
                     help="Extra -D flag for CMake; repeatable; part of the build key."),
        click.option("--cuda-arch", "cuda_archs", default="", metavar="ARCHS",
                     help="CUDA: compute capabilities to compile, comma separated (e.g. 90 "
                          "or 89,90; default: ggml's portable list; --reduced: 90)."),
        click.option("--amdgpu-targets", "amdgpu_targets", default="", metavar="TARGETS",
                     help="ROCm: gfx targets to compile, comma separated (e.g. gfx1100; "
                          "default: the GPUs present natively, the Dockerfile's list in a "
                          "container; --reduced: gfx1100)."),
        click.option("--reduced", is_flag=True,
                     help="CUDA/ROCm: the reduced variant CI builds — one architecture, no "
                          "FlashAttention kernels; named in the build key."),
        click.option("--rpc", is_flag=True,
                     help="Add ggml's RPC backend (GGML_RPC=ON) and build its RPC server "
                          "(bin/ggml-rpc-server) beside llama-server: the build the "
                          "multi-device suite spreads a model over RPC devices with."),
    )):
        command = option(command)
    return command


def build_request(*, backend: str, native: bool, cmake_args: tuple[str, ...],
                  cuda_archs: str, amdgpu_targets: str, reduced: bool,
                  rpc: bool = False) -> BuildRequest:
    """The request the options above describe, or a usage error saying what is wrong."""
    chosen = Backend(backend)
    try:
        return BuildRequest(backend=chosen, native=native, extra_cmake_args=cmake_args,
                            gpu_archs=_gpu_archs(chosen, cuda_archs, amdgpu_targets),
                            reduced=reduced, rpc=rpc)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _gpu_archs(backend: Backend, cuda_archs: str, amdgpu_targets: str) -> tuple[str, ...]:
    """The architecture option that belongs to ``backend``; the other one is an error."""
    for option, value, owner in (("--cuda-arch", cuda_archs, Backend.CUDA),
                                 ("--amdgpu-targets", amdgpu_targets, Backend.ROCM)):
        if value and backend is not owner:
            raise click.UsageError(f"{option} is for --backend {owner.value}, "
                                   f"not {backend.value}")
    chosen = cuda_archs if backend is Backend.CUDA else amdgpu_targets
    return tuple(part.strip() for part in chosen.split(",") if part.strip())
