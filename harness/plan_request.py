"""The one way a launch plan's request is built, for every entry point.

The suites (the plugin's ``plan_for``), ``harness plan``, ``harness tune`` and what they
feed (``harness repro`` reruns a suite test; ``harness calibrate`` reads stored runs, so
plans nothing itself) plan a launch from the same facts, read here: the model's GGUF
header or the bundle's manifest and files, the build under test (its capabilities, its
key and its llama.cpp release, whose rules the KV model follows), the card configs, the
forks' KV types and the ``HARNESS_*`` environment. Two callers that read these facts
differently plan different launches for one binary: ``harness plan`` once planned every
build as the pin, because it left the release out.

A top-level module rather than part of ``harness.planning`` (pure, no I/O) or
``harness.probes`` (which ``harness.builds`` reads from): it reads files through both.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.builds.under_test import BuildUnderTest
from harness.facts.build import Capabilities
from harness.facts.catalog import Bundle
from harness.facts.gpu import ForkKvType, GpuConfig, GpuInfo
from harness.planning.launch_plan import PlanRequest
from harness.planning.rocm_env import RocmLaunchEnv
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_fork_kv_types, load_gpu_configs


@dataclass(frozen=True)
class CardFacts:
    """The card configs of a folder and the forks' KV types, as the planner reads them."""

    configs: tuple[GpuConfig, ...]
    fork_kv_types: tuple[ForkKvType, ...]


def read_cards(configs: Path | None = None) -> CardFacts:
    """The cards in ``configs`` (None: the packaged folder) and the forks' KV types."""
    return CardFacts(load_gpu_configs(configs), load_fork_kv_types())


def planner_environ(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The ``HARNESS_*`` variables the planner reads (it reads no others)."""
    return {k: v for k, v in environ.items() if k.startswith("HARNESS_")}


def read_plan_request(*, build: BuildUnderTest | None, bundle: Bundle | None = None,
                      model: Path | None = None, gpu: GpuInfo | None = None,
                      configs: Path | None = None,
                      per_call: Mapping[str, object] | None = None,
                      environ: Mapping[str, str] | None = None,
                      cards: CardFacts | None = None,
                      launch_env: RocmLaunchEnv | None = None,
                      projector: Path | None = None) -> PlanRequest:
    """The request for a launch of ``bundle`` (read with ``harness.probes.bundles``) or
    the bare ``model`` on ``build`` (None: no build known, capabilities unknown, planned
    as the pin). ``configs``: the card folder (None: the packaged one); ``environ``:
    default the process's; ``cards``: the folder's cards and the forks' KV types, already
    read by ``read_cards`` (a caller that plans many launches reads them once);
    ``launch_env``: a ROCm build's, from ``harness.builds.devices_seen.plan_launch_env``;
    ``projector``: a vision projector to load with the model (``--mmproj``)."""
    if (bundle is None) == (model is None):
        raise ValueError("plan a bundle or a model, not both or neither")
    model_path = bundle.text_model if bundle is not None else model
    assert model_path is not None
    drafter = bundle.drafter_path if bundle is not None else None
    cards = cards or read_cards(configs)
    return PlanRequest(
        model_path=model_path,
        model=read_model_facts(model_path),
        bundle=bundle,
        drafter_model=read_model_facts(drafter) if drafter else None,
        gpu=gpu,
        configs=cards.configs,
        capabilities=(build.info.capabilities if build is not None and build.info
                      else Capabilities()),
        build_key=build.key if build is not None else "",
        release=build.release if build is not None else None,
        backend=build.backend if build is not None else None,
        per_call=dict(per_call or {}),
        environ=planner_environ(os.environ if environ is None else environ),
        fork_kv_types=cards.fork_kv_types,
        launch_env=launch_env,
        projector=projector,
        projector_bytes=projector.stat().st_size if projector is not None else 0,
    )
