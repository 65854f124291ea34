"""The main job's run record, made up at its measured size, for the service benchmarks.

One night of the main job stores 402 figures over 30 figure keys and 6 metrics, and 100
test outcomes (measured from the suites' own run.json). ``dashboard_speed.py`` and
``service_scale.py`` store thousands of these; both build them here, so the two measure
the same record.
"""

from __future__ import annotations

import random

from harness.results.run_record import (
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    Outcome,
    RunRecord,
    TestOutcome,
)

FIGURE_KEYS = 30
FIGURES = 402
OUTCOMES = 100
METRICS = ("load_s", "ttft_ms", "prompt_tps", "decode_tps", "kv_mib", "peak_host_mib")
BASE = {"load_s": 0.8, "ttft_ms": 15.0, "prompt_tps": 900.0, "decode_tps": 120.0,
        "kv_mib": 64.0, "peak_host_mib": 700.0}
FIXTURES = ("tiny-llama", "dense", "moe", "bench", "bench-large", "swa")
HARDWARE = (
    Hardware(host="ci-cpu-1", cpu="AMD EPYC 7763 64-Core Processor"),
    Hardware(host="ci-h100-1", cpu="Intel Xeon Gold 6338", gpu="NVIDIA H100 80GB HBM3",
             gpu_driver="550.54.15", vram_mib=81559),
    Hardware(host="ci-mi300-1", cpu="AMD EPYC 9654", gpu="AMD Instinct MI300X",
             gpu_driver="6.2.4", vram_mib=196592),
    Hardware(host="ci-l4-1", cpu="Intel Xeon Platinum 8481C", gpu="NVIDIA L4",
             gpu_driver="550.54.15", vram_mib=23034),
)


def figure_keys(backend: str, gpu: str) -> list[FigureKey]:
    """30 keys, as the suites' launches vary them: fixture, KV types, flash-attn, offload."""
    kv = (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("f16", "q8_0"), ("q8_0", "f16"))
    keys = []
    for i in range(FIGURE_KEYS):
        k, v = kv[i % len(kv)]
        keys.append(FigureKey(
            fixture=FIXTURES[i % len(FIXTURES)] + ("+drafter" if i == 29 else ""),
            backend=backend, gpu=gpu, n_gpu_layers="0" if gpu == "none" else "99",
            cache_type_k=k, cache_type_v=v, flash_attn="on" if i % 2 else "off",
            offload="n-cpu-moe=2" if i in (7, 19) else "", n_prompt=32, n_gen=64))
    return keys


def main_job_run(run_id: str, *, branch: str, hardware: Hardware, started: str,
                 rng: random.Random, labels: dict[str, str] | None = None) -> RunRecord:
    """One run of the main job on ``hardware``: figures with a 3 % noise, one failure in
    about 2,000 outcomes, the skips a build without a feature gives."""
    backend = "cpu" if hardware.gpu is None else ("rocm" if "AMD" in hardware.gpu else "cuda")
    keys = figure_keys(backend, "none" if hardware.gpu is None else hardware.gpu)
    commit = f"{rng.getrandbits(160):040x}"
    run_figures = []
    for j in range(FIGURES):
        metric = METRICS[(j // FIGURE_KEYS) % len(METRICS)]
        value = BASE[metric] * (1 + (j % 7) / 10) * rng.gauss(1.0, 0.03)
        run_figures.append(Figure(
            test_id=f"suites/test_{FIXTURES[j % 6]}.py::test_launch[{j % 17}]",
            key=keys[j % FIGURE_KEYS], metric=metric, value=round(value, 4),
            predicted=round(BASE[metric] * 1.2, 3) if metric == "decode_tps" else None))
    run_outcomes = []
    for j in range(OUTCOMES):
        result = Outcome.SKIPPED if j % 23 == 0 else Outcome.PASSED
        if j == 41 and rng.random() < 0.05:
            result = Outcome.FAILED
        run_outcomes.append(TestOutcome(
            test_id=f"suites/test_{FIXTURES[j % 6]}.py::test_case_{j}",
            outcome=result, duration_s=round(rng.uniform(0.05, 8.0), 3),
            message="AssertionError: decode speed fell" if result is Outcome.FAILED
            else ("not supported by this build: --no-op" if result is Outcome.SKIPPED
                  else None)))
    return RunRecord(
        run_id=run_id, branch=branch, commit=commit, started_at=started,
        finished_at=started, hardware=hardware,
        build=BuildRef(backend=backend, version=f"version: 5000 ({commit[:8]})",
                       source_digest=commit[:64].ljust(64, "0"),
                       build_key=f"{backend}-{commit[:12]}"),
        harness_version="0.1.0", outcomes=tuple(run_outcomes), figures=tuple(run_figures),
        labels={"job": "main", "runner": hardware.host} if labels is None else labels)
