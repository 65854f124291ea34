"""Predicted against measured decode speed, on the large fixture and the pinned CPU build.

Writes the large fixture when missing (fixtures/models/large/bench-large.json,
about 300 MiB of f32 weights: far beyond the last-level cache, so every token streams
them from memory), plans it for this machine (no GPU: every byte from host memory),
predicts its decode speed from this host's measured read bandwidth
(harness/planning/decode_speed.py over harness/probes/host_memory.py) and measures it:
one server started as the suites start one, REPETITIONS completions of TOKENS tokens
after a short prompt, the median. Prints the prediction, the measurement and their
ratio (measured / predicted); the same for the ``bench`` fixture (~37 MiB, inside the
cache's reach) shows why the large one is needed.

    .venv/bin/python benchmarks/decode_prediction.py [--repetitions 5] [--tokens 64]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from harness import modelgen
from harness.builds.resolve import ensure_build
from harness.facts.build import Capabilities
from harness.paths import cache_root
from harness.perf.measure import measure_speed
from harness.planning.build_plan import BuildRequest
from harness.planning.decode_speed import (
    DecodePrediction,
    HostBandwidth,
    plan_bandwidths,
    predict_decode,
)
from harness.planning.launch_plan import PlanRequest, plan_launch
from harness.probes.gguf_facts import read_model_facts
from harness.probes.gpu_configs import load_fork_kv_types
from harness.probes.host_memory import host_memory
from harness.runners.subprocess_runner import SubprocessRunner

PROMPT_TOKENS = 32


def compare(name: str, path: Path, runner: SubprocessRunner, host: HostBandwidth, *,
            capabilities: Capabilities, repetitions: int, tokens: int) -> None:
    model = read_model_facts(path)
    plan = plan_launch(PlanRequest(model_path=path, model=model,
                                   capabilities=capabilities,
                                   fork_kv_types=load_fork_kv_types()))
    bandwidths = plan_bandwidths(plan, None, host)
    assert not isinstance(bandwidths, str)
    # The middle of the generated run: the K/V read grows with the depth.
    predicted: DecodePrediction = predict_decode(
        model, plan.spec, plan.kv, bandwidths, depth=PROMPT_TOKENS + tokens // 2)
    server = runner.start(plan.spec)
    try:
        sample = measure_speed(server.base_url, PROMPT_TOKENS, tokens, repetitions)
    finally:
        server.stop()
    measured = sample.decode_tps
    print(f"{name}: {model.file_size / 2**20:.0f} MiB file, "
          f"{predicted.host_bytes_per_token / 2**20:.1f} MiB read per token")
    print(f"  predicted {predicted.tokens_per_s:.1f} tokens/s "
          f"({bandwidths.host_gbps:.1f} GB/s x 0.6)")
    if measured is None:
        print("  measured: no decode timing came back")
        return
    print(f"  measured  {measured:.1f} tokens/s (median of {repetitions})")
    print(f"  ratio     {measured / predicted.tokens_per_s:.2f} (measured / predicted)"
          + (f"; {predicted.caveat}" if predicted.caveat else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    cache = cache_root()
    build = ensure_build(cache, BuildRequest()).info
    measured = host_memory(cache)
    host = measured.bandwidth()
    print(f"host read bandwidth {measured.read_gbps:.1f} GB/s ({measured.threads} threads, "
          f"{measured.measured_at}); last-level cache "
          f"{measured.last_level_cache_bytes / 2**20:.0f} MiB")
    large = modelgen.ensure_large_fixture()
    small = modelgen.ensure_fixtures().model("bench")
    with tempfile.TemporaryDirectory(prefix="decode-prediction-") as logs:
        runner = SubprocessRunner(Path(build.binary), Path(logs))
        for name, path in (("bench-large", large), ("bench", small)):
            compare(name, path, runner, host, capabilities=build.capabilities,
                    repetitions=args.repetitions, tokens=args.tokens)


if __name__ == "__main__":
    main()
