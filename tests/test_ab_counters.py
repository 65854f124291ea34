"""Deterministic counters: read from real startup logs and completions, compared per arm.

The logs are the corpus in tests/data/logs (its README says which are captured): a CPU
build with a drafter, an SWA model (two KV lines in one buffer), and the Vulkan build
offloading to llvmpipe (the one captured log with an ``offloaded N/M layers`` line).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.ab.counters import (
    CELL_CHARS,
    MISSING,
    CounterChange,
    CounterReport,
    compare_counters,
    counters_json,
    counters_markdown,
    read_counters,
)

CORPUS = Path(__file__).parent / "data" / "logs"


def _log(name: str) -> str:
    return (CORPUS / f"{name}.log").read_text()


def _completion(content: str = "The quick brown fox", **timings: Any) -> dict[str, Any]:
    return {"content": content, "tokens_predicted": 8,
            "timings": {"prompt_n": 5, "prompt_ms": 1.25, "predicted_n": 8,
                        "predicted_ms": 3.5, **timings}}


# --- reading ---------------------------------------------------------------------------------


def test_cpu_log_with_drafter_has_buffers_per_block_and_no_offload_counter() -> None:
    counters = read_counters(_log("cpu/drafter-used"), None)

    assert counters == {
        "model_mib[CPU_Mapped]": "0.41",
        "kv_mib[CPU]": "0.25",
        "compute_mib[CPU]": "2.14",
        "drafter.model_mib[CPU_Mapped]": "0.10",
        "drafter.kv_mib[CPU]": "0.06",
        "drafter.compute_mib[CPU]": "1.39",
    }


def test_kv_lines_of_one_buffer_are_summed_as_residency_does() -> None:
    # The SWA fixture prints ``CPU KV buffer size`` twice: 0.50 (non-SWA) and 0.09 (SWA).
    counters = read_counters(_log("cpu/sliding-window"), None)

    assert counters["kv_mib[CPU]"] == "0.59"
    assert "layers_offloaded" not in counters


def test_offloading_log_has_layers_and_device_buffers() -> None:
    counters = read_counters(_log("vulkan/captured-software-device"), None)

    assert counters == {
        "layers_offloaded": "3/3",
        "model_mib[CPU_Mapped]": "0.07",
        "model_mib[Vulkan0]": "0.35",
        "kv_mib[Vulkan0]": "0.12",
        "compute_mib[Vulkan0]": "1.51",
        "compute_mib[Vulkan_Host]": "1.02",
    }


def test_mtp_drafter_has_kv_and_compute_but_no_weights() -> None:
    counters = read_counters(_log("cuda/mtp-used"), None)

    assert counters["layers_offloaded"] == "4/4"
    assert counters["drafter.kv_mib[CUDA0]"] == "0.12"
    assert not any(name.startswith("drafter.model_mib") for name in counters)


def test_mib_keep_their_printed_digits() -> None:
    log = ("0.00.100.000 I load_tensors:        CUDA0 model buffer size = 12345.60 MiB\n"
           "0.00.100.000 I llama_kv_cache:      CUDA0 KV buffer size =   256.00 MiB\n")

    counters = read_counters(log, None)

    assert counters == {"model_mib[CUDA0]": "12345.60", "kv_mib[CUDA0]": "256.00"}


def test_completion_without_drafter() -> None:
    counters = read_counters("", _completion("Hello\n world"))

    assert counters == {"greedy_text": "Hello\n world", "prompt_tokens": "5",
                        "predicted_tokens": "8"}


def test_completion_with_draft_counts() -> None:
    counters = read_counters("", _completion(draft_n=12, draft_n_accepted=7))

    assert counters["drafted_tokens"] == "12"
    assert counters["accepted_tokens"] == "7"


@pytest.mark.parametrize("completion", [
    {"timings": {"predicted_n": True, "draft_n": 3.0, "prompt_n": "5"}},
    {"content": None, "timings": None},
    {},
])
def test_malformed_completion_fields_are_left_out(completion: dict[str, Any]) -> None:
    assert read_counters("", completion) == {}


def test_empty_greedy_text_is_a_counter() -> None:
    assert read_counters("", {"content": ""}) == {"greedy_text": ""}


# --- comparing -------------------------------------------------------------------------------


def _start(log: str = "cpu/drafter-used", **completion: Any) -> dict[str, str]:
    return read_counters(_log(log), _completion(**completion))


def test_one_changed_counter_is_the_only_change() -> None:
    baseline = [_start(), _start()]
    candidate = [_start(content="The quick brown cat"), _start(content="The quick brown cat")]

    report = compare_counters(baseline, candidate)

    assert report.changed == (
        CounterChange("greedy_text", "The quick brown fox", "The quick brown cat"),)
    assert report.not_deterministic == ()
    assert set(report.unchanged) == set(baseline[0]) - {"greedy_text"}


def test_changed_kv_buffer_reported_with_both_values() -> None:
    baseline = [_start("cuda/used")]
    candidate = [dict(baseline[0], **{"kv_mib[CUDA0]": "0.25"})]

    report = compare_counters(baseline, candidate)

    assert report.changed == (CounterChange("kv_mib[CUDA0]", "0.50", "0.25"),)


def test_counter_that_varies_within_an_arm_is_not_deterministic_not_a_change() -> None:
    baseline = [_start(content="a"), _start(content="b")]
    candidate = [_start(content="c"), _start(content="c")]

    report = compare_counters(baseline, candidate)

    assert report.not_deterministic == ("greedy_text",)
    assert report.changed == ()
    assert "greedy_text" not in report.unchanged


def test_counter_absent_in_some_starts_of_an_arm_varies() -> None:
    baseline = [_start(draft_n=4, draft_n_accepted=2), _start()]
    candidate = [_start(), _start()]

    report = compare_counters(baseline, candidate)

    assert set(report.not_deterministic) == {"drafted_tokens", "accepted_tokens"}
    assert report.changed == ()


def test_counter_missing_in_one_arm_is_a_change() -> None:
    # A CPU baseline against a build that offloads: every buffer name differs too.
    baseline = [_start("cpu/drafter-used")]
    candidate = [_start("vulkan/captured-software-device")]

    report = compare_counters(baseline, candidate)

    changes = {c.name: c for c in report.changed}
    assert changes["layers_offloaded"] == CounterChange("layers_offloaded", MISSING, "3/3")
    assert changes["kv_mib[CPU]"] == CounterChange("kv_mib[CPU]", "0.25", MISSING)
    assert changes["drafter.kv_mib[CPU]"].candidate == MISSING
    assert "greedy_text" in report.unchanged


def test_names_keep_first_appearance_order() -> None:
    report = compare_counters([{"b": "1", "a": "1"}], [{"a": "1", "c": "1", "b": "1"}])

    assert report.unchanged == ("b", "a")
    assert [c.name for c in report.changed] == ["c"]


@pytest.mark.parametrize(("baseline", "candidate"), [([], [{"a": "1"}]), ([{"a": "1"}], [])])
def test_an_empty_arm_is_refused(baseline: list[dict[str, str]],
                                 candidate: list[dict[str, str]]) -> None:
    with pytest.raises(ValueError, match="at least one server start"):
        compare_counters(baseline, candidate)


# --- output ----------------------------------------------------------------------------------


def test_json_keeps_whole_values() -> None:
    long_text = "x" * 500
    report = CounterReport(changed=(CounterChange("greedy_text", long_text, MISSING),),
                           unchanged=("predicted_tokens",), not_deterministic=("kv_mib[CPU]",))

    assert counters_json(report) == {
        "changed": [{"name": "greedy_text", "baseline": long_text, "candidate": "missing"}],
        "unchanged": ["predicted_tokens"],
        "not_deterministic": ["kv_mib[CPU]"],
    }


def test_markdown_table_of_changes() -> None:
    report = CounterReport(
        changed=(CounterChange("kv_mib[CUDA0]", "0.50", "0.25"),
                 CounterChange("greedy_text", "a|b\nc", MISSING)),
        unchanged=("predicted_tokens",), not_deterministic=("compute_mib[CUDA0]",))

    assert counters_markdown(report) == (
        "**2 of 3 deterministic counters changed**\n"
        "\n"
        "| counter | baseline | candidate |\n"
        "|---|---|---|\n"
        "| kv_mib[CUDA0] | 0.50 | 0.25 |\n"
        '| greedy_text | "a\\|b\\nc" | missing |\n'
        "\n"
        "Unchanged: 1.\n"
        "Not deterministic (differed between starts of one build, not compared): "
        "compute_mib[CUDA0].\n")


def test_markdown_without_changes() -> None:
    report = CounterReport(changed=(), unchanged=("a", "b"), not_deterministic=())

    assert counters_markdown(report) == "No deterministic counter changed (2 compared).\n"


def test_markdown_cuts_long_texts_where_they_differ() -> None:
    common = "word " * 40
    report = CounterReport(
        changed=(CounterChange("greedy_text", common + "fox jumps", common + "cat sleeps"),),
        unchanged=(), not_deterministic=())

    row = counters_markdown(report).splitlines()[4]
    name, base, cand = (cell.strip() for cell in row.strip("|").split(" | "))
    assert name == "greedy_text"
    for cell, tail in ((base, "fox jumps"), (cand, "cat sleeps")):
        assert cell.startswith("…")
        assert len(cell) <= CELL_CHARS
        assert tail in cell


def test_markdown_cuts_a_long_text_against_missing_from_its_start() -> None:
    report = CounterReport(changed=(CounterChange("greedy_text", "y" * 200, MISSING),),
                           unchanged=(), not_deterministic=())

    row = counters_markdown(report).splitlines()[4]

    assert f'| "{"y" * (CELL_CHARS - 2)}… | missing |' in row
