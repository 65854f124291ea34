"""The decode speed a measured server was predicted to reach (recorded beside its figure).

The model is harness/planning/decode_speed.py's, pure; this module gathers its facts for
one started server: the GGUF's facts (read again from the file the server loaded), the
K/V cache of the plan the test made for exactly that launch (without one, only the
weights count: the suites measure at a depth of a few dozen tokens, where the cache read
is small), this host's measured read bandwidth, and on a GPU build the card's bandwidth
from its GPU config. A GPU that no config names gets no prediction rather than a guess;
a drafter's speculation is not modelled.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from harness.errors import HarnessError
from harness.facts.gpu import GpuConfig
from harness.paths import cache_root
from harness.planning.autotune import match_config
from harness.planning.decode_speed import HostBandwidth, predict_decode
from harness.planning.launch import LaunchSpec
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_gpu_configs
from harness.probes.host_memory import host_memory
from harness.results.run_record import NO_GPU


@functools.cache
def _cards() -> tuple[GpuConfig, ...]:
    """The card configs, validated once per process: every measured server asks."""
    return load_gpu_configs()


@functools.cache
def _host() -> HostBandwidth:
    """This host's read bandwidth, read (or measured) once per process."""
    return host_memory(cache_root()).bandwidth()


def predicted_decode_tps(spec: LaunchSpec, plans: Sequence[Any], *, backend: str,
                         gpu_name: str, depth: int) -> float | None:
    """Tokens/s the bandwidth model gives ``spec``'s server at ``depth``; None when a
    fact it needs is missing (an unreadable model, a GPU without a config)."""
    plan = next((p for p in plans if getattr(p, "spec", None) == spec), None)
    try:
        model = read_model_facts(spec.model)
        bandwidths = _host().bandwidths()
        if backend != "cpu":
            config = (match_config(gpu_name, _cards())
                      if gpu_name and gpu_name != NO_GPU else None)
            if config is None:
                return None
            bandwidths = replace(bandwidths, gpu_gbps=config.memory_bandwidth_gbps,
                                 gpu_source=config.name)
        predicted = predict_decode(model, spec, getattr(plan, "kv", None), bandwidths,
                                   depth=depth, kv_offload=spec.kv_offload is not False)
    except (HarnessError, OSError, ValueError):
        return None
    return predicted.tokens_per_s or None
