"""The Vulkan build's numbers, held to the reference like the CPU build's.

In the Vulkan image on Mesa's software device (``GGML_VK_VISIBLE_DEVICES=0`` selects
llvmpipe, so the server really runs ggml-vulkan's shaders), the numerics probe of
``suites/test_numerics.py`` on the fixtures whose kernels differ most: f32 and the
quantized copies, the sliding window, the MoE router, a q8_0 KV cache. Vulkan gets no
allowance: measured on llvmpipe (2026-12-04), every probe stayed inside the CPU's
limits, the quantized ones closer than the CPU build (bench-q4_0 7.3e-4 against its
3.3e-3).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import modelgen
from harness.builds.container_build import pinned_source_image
from harness.client import ServerClient
from harness.facts.build import Backend
from harness.modelgen.fixture_data import load_all
from harness.numerics.probe import against_reference, greedy_distributions
from harness.numerics.thresholds import threshold
from harness.numerics.token_bytes import read_token_bytes
from harness.numerics.verdict import judge
from harness.planning.build_plan import BuildRequest
from harness.planning.launch import LaunchSpec
from harness.reference import load_reference
from harness.runners.container_runner import ContainerRunner

pytestmark = [pytest.mark.docker, pytest.mark.server]

#: (fixture, KV cache type): f32 and two quantized kernels, the window, the router, and
#: a quantized cache on a head width that allows it.
PROBES = [("bench", "f16"), ("bench-q4_0", "f16"), ("bench-q8_0", "f16"), ("swa", "f16"),
          ("moe", "f16"), ("bench", "q8_0")]


@pytest.fixture(scope="module")
def vulkan_image() -> str:
    image = pinned_source_image(BuildRequest(backend=Backend.VULKAN)).image
    assert image is not None
    return image


@pytest.mark.parametrize(("name", "kv"), PROBES, ids=[f"{n}-{k}" for n, k in PROBES])
def test_vulkan_on_llvmpipe_matches_the_reference(vulkan_image: str, name: str, kv: str,
                                                  fixture_set: modelgen.FixtureSet,
                                                  tmp_path: Path) -> None:
    model = fixture_set.model(name)
    weight_type = load_all()[0][name].weight_type
    reference, token_bytes = load_reference(model), read_token_bytes(model)
    runner = ContainerRunner(vulkan_image, tmp_path / "logs", ready_timeout_s=300,
                             env={"GGML_VK_VISIBLE_DEVICES": "0"})
    spec = LaunchSpec(model=model, ctx_size=512, parallel=1, cache_type_k=kv,
                      cache_type_v=kv)
    with runner.start(spec) as server:
        with ServerClient(server.base_url, timeout_s=300) as client:
            prompt, reported = greedy_distributions(client, reference.n_vocab, token_bytes)
        log = server.log_text()
    # The probe ran on the Vulkan device, not on the CPU fallback.
    assert "using device Vulkan0 (llvmpipe" in log, log[-2000:]
    result = against_reference(prompt, reported, reference)
    label = f"{name} ({weight_type.value} weights, KV {kv}) on Vulkan llvmpipe"
    failures = judge(label, result.figures, result.summary,
                     threshold(weight_type, kv, Backend.VULKAN), token_bytes)
    assert not failures, "\n".join(failures)
