"""``--harness-require-gpu BACKEND[:N]``: the GPU backend a run demands, and how many of
its devices (a multi-GPU runner: ``cuda:2``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from harness.facts.build import GPU_BACKENDS, Backend


@dataclass(frozen=True)
class GpuRequirement:
    """``--harness-require-gpu``: the backend, and how many of its devices the run needs."""

    backend: Backend
    count: int = 1


def gpu_requirement(text: str) -> GpuRequirement:
    """``cuda`` or ``cuda:2``: a GPU backend, optionally with a device count of at least 1."""
    name, colon, count = text.partition(":")
    allowed = ", ".join(b.value for b in GPU_BACKENDS)
    if name not in {b.value for b in GPU_BACKENDS}:
        raise argparse.ArgumentTypeError(f"{name!r} is not one of {allowed} (BACKEND or "
                                         "BACKEND:N, N devices at least)")
    if colon and not (count.isdigit() and int(count) >= 1):
        raise argparse.ArgumentTypeError(f"{text!r}: the device count after ':' must be a "
                                         "whole number of at least 1 (cuda:2)")
    return GpuRequirement(Backend(name), int(count) if count else 1)
