"""Performance keys (pure) and measurements (a real llama-server, this process, the kernel)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gpu_helpers
import pytest

from harness import modelgen
from harness.perf.keys import figure_key, figures, fixture_label, offload_label
from harness.perf.measure import (
    amd_vram_mib,
    kv_mib,
    measure_speed,
    peak_host_mib,
    prompt_ids,
    vram_mib,
)
from harness.planning.launch import LaunchSpec
from harness.plugin import StartServer
from harness.results.run_record import Figure, FigureKey
from harness.verdicts.kv_log import parse_kv_cache_lines

MODEL = Path("/models/dense.gguf")
DRAFTER = Path("/models/drafter.gguf")




NO_NVML = pytest.mark.skipif(gpu_helpers.nvml_answers(), reason="NVML answers on this machine")


# -- keys --------------------------------------------------------------------------------


@pytest.mark.parametrize(("spec", "label"), [
    (LaunchSpec(model=MODEL), "dense"),
    (LaunchSpec(model=MODEL, drafter=DRAFTER, spec_type="draft-simple"), "dense+drafter"),
    (LaunchSpec(model=MODEL, drafter=DRAFTER), "dense+drafter"),
    (LaunchSpec(model=Path("/m/mtp.gguf"), spec_type="draft-mtp"), "mtp+draft-mtp"),
], ids=["plain", "drafter-wins-over-spec-type", "drafter-only", "spec-type-only"])
def test_fixture_label_names_the_model_and_how_it_speculates(spec: LaunchSpec,
                                                             label: str) -> None:
    assert fixture_label(spec) == label


@pytest.mark.parametrize(("changes", "words"), [
    ({}, ""),
    ({"n_cpu_moe": 2}, "n-cpu-moe=2"),
    ({"n_cpu_moe": 0}, "n-cpu-moe=0"),
    ({"cpu_moe": True}, "cpu-moe"),
    ({"n_cpu_ffn": 3}, "n-cpu-ffn=3"),
    ({"kv_offload": False}, "no-kv-offload"),
    ({"kv_offload": True}, ""),
    ({"n_cpu_moe": 4, "cpu_moe": True, "n_cpu_ffn": 1, "kv_offload": False},
     "n-cpu-moe=4,cpu-moe,n-cpu-ffn=1,no-kv-offload"),
])
def test_offload_label_lists_the_overrides_in_force(changes: dict[str, object],
                                                    words: str) -> None:
    assert offload_label(LaunchSpec(model=MODEL, **changes)) == words  # type: ignore[arg-type]


def test_figure_key_of_a_spec_that_leaves_everything_to_the_server() -> None:
    key = figure_key(LaunchSpec(model=MODEL), backend="cpu", gpu="none", n_prompt=32,
                     n_gen=64)
    assert key == FigureKey(fixture="dense", backend="cpu", gpu="none",
                            n_gpu_layers="default", cache_type_k="default",
                            cache_type_v="default", flash_attn="default", offload="",
                            n_prompt=32, n_gen=64)


def test_figure_key_of_a_spec_with_every_keyed_field_set() -> None:
    spec = LaunchSpec(model=MODEL, drafter=DRAFTER, spec_type="draft-simple", n_gpu_layers=0,
                      cache_type_k="q8_0", cache_type_v="q4_0", flash_attn="on",
                      n_cpu_moe=2, kv_offload=False)
    key = figure_key(spec, backend="cuda", gpu="NVIDIA H100", n_prompt=128, n_gen=16)
    assert key == FigureKey(fixture="dense+drafter", backend="cuda", gpu="NVIDIA H100",
                            n_gpu_layers="0", cache_type_k="q8_0", cache_type_v="q4_0",
                            flash_attn="on", offload="n-cpu-moe=2,no-kv-offload",
                            n_prompt=128, n_gen=16)


def test_an_explicit_value_and_the_default_are_different_keys() -> None:
    unset = figure_key(LaunchSpec(model=MODEL), backend="cpu", gpu="none", n_prompt=1, n_gen=1)
    explicit = figure_key(LaunchSpec(model=MODEL, n_gpu_layers=99, cache_type_k="f16"),
                          backend="cpu", gpu="none", n_prompt=1, n_gen=1)
    assert explicit != unset
    assert (explicit.n_gpu_layers, explicit.cache_type_k) == ("99", "f16")


def test_figures_are_one_per_metric_sorted_by_name_under_one_key() -> None:
    key = figure_key(LaunchSpec(model=MODEL), backend="cpu", gpu="none", n_prompt=32, n_gen=64)
    made = figures("suites/t.py::test_x", key, {"ttft_ms": 3.5, "decode_tps": 900.0,
                                                 "kv_mib": 0.12})
    assert made == [Figure("suites/t.py::test_x", key, "decode_tps", 900.0),
                    Figure("suites/t.py::test_x", key, "kv_mib", 0.12),
                    Figure("suites/t.py::test_x", key, "ttft_ms", 3.5)]
    assert figures("suites/t.py::test_x", key, {}) == []


# -- measurements without a server -------------------------------------------------------


@pytest.mark.parametrize("n", [0, 1, 32, 512])
def test_prompt_ids_have_the_exact_length_and_no_special_ids(n: int) -> None:
    ids = prompt_ids(n)
    assert len(ids) == n
    assert all(i >= 3 for i in ids), "ids 0-2 are unknown/BOS/EOS in every fixture vocab"
    assert ids == prompt_ids(n), "the prompt must be the same on every call"


def test_prompt_ids_are_not_one_repeated_token() -> None:
    assert len(set(prompt_ids(32))) == 32


def test_peak_host_mib_of_this_process_is_positive() -> None:
    peak = peak_host_mib(os.getpid())
    assert peak is not None
    # This interpreter with pytest, numpy and httpx loaded holds well over 10 MiB.
    assert peak > 10


def test_peak_host_mib_of_no_process_is_none() -> None:
    pid_max = int(Path("/proc/sys/kernel/pid_max").read_text())
    assert peak_host_mib(pid_max + 1) is None
    assert peak_host_mib(None) is None


@NO_NVML
def test_vram_mib_without_nvml_is_none() -> None:
    assert vram_mib(os.getpid()) is None


def test_vram_mib_of_no_pid_is_none() -> None:
    assert vram_mib(None) is None


def test_kv_mib_of_text_without_kv_lines_is_none() -> None:
    assert kv_mib("") is None
    assert kv_mib("main: loading model\nsrv  listening on http://127.0.0.1:1234\n") is None


def test_kv_mib_adds_every_cache_the_log_shows() -> None:
    # Two caches of a sliding-window start, in llama_kv_cache's own format.
    log = "\n".join([
        "llama_kv_cache_iswa: creating non-SWA KV cache, size = 512 cells",
        "llama_kv_cache: size =    0.12 MiB (   512 cells,   2 layers,  1/1 seqs), "
        "K (f16):    0.06 MiB, V (f16):    0.06 MiB",
        "llama_kv_cache_iswa: creating     SWA KV cache, size = 256 cells",
        "llama_kv_cache: size =    0.25 MiB (   256 cells,   4 layers,  1/1 seqs), "
        "K (f16):    0.12 MiB, V (f16):    0.12 MiB",
    ])
    assert kv_mib(log) == pytest.approx(0.37)


# -- measurements of a real server -------------------------------------------------------

SERVER = pytest.mark.server


@SERVER
def test_kv_mib_of_a_real_start_log_matches_the_parsed_lines(
        fixture_set: modelgen.FixtureSet, start_server: StartServer) -> None:
    server = start_server(LaunchSpec(model=fixture_set.model("dense"), ctx_size=512))
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    lines = parse_kv_cache_lines(log)
    assert lines, "a -lv 4 start logs its KV cache"
    measured = kv_mib(log)
    assert measured is not None
    assert measured > 0
    assert measured == float(sum(line.size_mib for line in lines))


@SERVER
def test_measure_speed_of_the_bench_fixture(fixture_set: modelgen.FixtureSet,
                                            start_server: StartServer) -> None:
    server = start_server(LaunchSpec(model=fixture_set.model("bench"), ctx_size=512))
    speed = measure_speed(server.base_url, 32, 16, repetitions=2)
    assert speed.decode_tps is not None, speed
    assert speed.prompt_tps is not None, speed
    assert speed.ttft_ms is not None, speed
    assert speed.decode_tps > 0
    assert speed.ttft_ms > 0
    # A 32-token prompt is read in one batch; decoding is one token per step.
    assert speed.prompt_tps > speed.decode_tps, speed


def test_a_first_token_request_ends_before_the_next_starts(
        fixture_set: modelgen.FixtureSet, start_server: StartServer) -> None:
    """Each timed first token's request runs to its end: none is left generating behind a
    closed stream (the server would cancel it, and the next request would overlap it —
    with 1024-token prompts two of them overflowed the slots' shared KV cache)."""
    server = start_server(LaunchSpec(model=fixture_set.model("bench"), ctx_size=1536))
    speed = measure_speed(server.base_url, 1024, 16, repetitions=1)
    assert speed.ttft_ms is not None, speed
    log = server.log_text()
    assert "cancel task" not in log
    assert "Context size has been exceeded" not in log


class _AmdSmi:
    """A stand-in for the amdsmi module: two GPUs, processes in either API shape."""

    def __init__(self, *, new_api: bool, fail_init: bool = False) -> None:
        self.new_api = new_api
        self.fail_init = fail_init
        self.shut_down = False
        self.processes: dict[str, list[dict[str, Any]]] = {
            "gpu0": [{"pid": 4242, "memory_usage": {"vram_mem": 512 * 1024 * 1024}},
                     {"pid": 7, "memory_usage": {"vram_mem": 1024}}],
            "gpu1": [{"pid": 4242, "memory_usage": {"vram_mem": 256 * 1024 * 1024}}],
        }

    def amdsmi_init(self) -> None:
        if self.fail_init:
            raise RuntimeError("AMDSMI_STATUS_DRIVER_NOT_LOADED")

    def amdsmi_shut_down(self) -> None:
        self.shut_down = True

    def amdsmi_get_processor_handles(self) -> list[str]:
        return list(self.processes)

    def amdsmi_get_gpu_process_list(self, handle: str) -> list[object]:
        if self.new_api:
            return list(self.processes[handle])
        return [(handle, index) for index in range(len(self.processes[handle]))]

    def amdsmi_get_gpu_process_info(self, handle: str,
                                    entry: tuple[str, int]) -> dict[str, Any]:
        info = self.processes[handle][entry[1]]
        return {"pid": info["pid"], "mem": info["memory_usage"]["vram_mem"]}


@pytest.mark.parametrize("new_api", [True, False], ids=["process-dicts", "process-handles"])
def test_amd_smi_vram_is_summed_over_gpus_for_the_process(new_api: bool) -> None:
    smi = _AmdSmi(new_api=new_api)
    assert amd_vram_mib(4242, smi) == 768.0
    assert smi.shut_down
    assert amd_vram_mib(999, smi) is None


def test_amd_smi_without_a_driver_gives_no_figure() -> None:
    assert amd_vram_mib(4242, _AmdSmi(new_api=True, fail_init=True)) is None
