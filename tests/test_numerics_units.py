"""The numerics suite's pure parts: which tokens the server reports, the token bytes,
the parser of its distributions, the figures and the failure lines."""

from __future__ import annotations

import contextlib
import itertools
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.builds.tools import build_tool
from harness.errors import BuildError, FixtureError, ServerApiError
from harness.modelgen.kquant import kquant_copy
from harness.modelgen.specs import WeightType
from harness.numerics.divergence import position_figures, summarize
from harness.numerics.eval_callback import LAST_TENSOR, compare_prints
from harness.numerics.fingerprint import (
    BAND_FACTOR,
    KLD_FLOOR,
    Fingerprint,
    NumericsVerdict,
    compare_fingerprints,
    divergence,
    fingerprint_from_json,
)
from harness.numerics.probabilities import parse_distributions
from harness.numerics.reported import reported_positions
from harness.numerics.tensor_dump import first_difference, parse_dump
from harness.numerics.thresholds import KV_TYPES, threshold
from harness.numerics.token_bytes import _gpt2_byte_of_char
from harness.numerics.verdict import judge

#: A four-token vocabulary: ASCII "a", a 3-byte lead, a continuation byte, "b".
BYTES = (b"a", b"\xe2", b"\x82", b"b")


def test_a_token_ending_inside_a_character_has_no_entry() -> None:
    # "a", then the euro sign's three bytes one token each, then "b": the lead and the
    # second byte leave the text cut off; the third completes it.
    assert reported_positions([b"a", b"\xe2", b"\x82", b"\xac", b"b"]) == [0, 3, 4]


def test_a_lone_lead_blocks_the_next_three_tokens_then_is_given_up() -> None:
    # A 4-byte lead followed by ASCII: the server's rule looks back 4 bytes, so the lead
    # holds the next two tokens back too, and the fourth byte after it is free.
    assert reported_positions([b"\xf5", b"x", b"y", b"z", b"w"]) == [3, 4]


def test_continuation_bytes_alone_are_reported() -> None:
    assert reported_positions([b"\xad", b"\xb8", b"N"]) == [0, 1, 2]


def test_gpt2_table_maps_every_byte_once() -> None:
    table = _gpt2_byte_of_char()
    assert sorted(table.values()) == list(range(256))
    assert table["Ġ"] == ord(" ")  # GPT-2's space
    assert table["a"] == ord("a")


def _body(tokens: list[int], rows: list[list[tuple[int, float]]]) -> dict[str, Any]:
    return {"tokens": tokens, "completion_probabilities": [
        {"id": tokens[i], "top_logprobs": [{"id": t, "logprob": lp} for t, lp in row]}
        for i, row in zip(reported_positions([BYTES[t] for t in tokens]), rows,
                          strict=False)]}


def test_entries_are_matched_with_their_positions() -> None:
    half = math.log(0.5)
    body = _body([0, 1, 2, 3], [[(0, half), (3, half)], [(3, 0.0)]])
    parsed = parse_distributions(body, 4, BYTES)
    assert parsed.generated == (0, 1, 2, 3)
    assert parsed.indexes == (0, 3)  # 1 and 2 end inside the character
    assert parsed.log_probs[0, 0] == pytest.approx(half)
    assert parsed.log_probs[0, 1] == -np.inf
    assert parsed.log_probs[1, 3] == 0.0


@pytest.mark.parametrize(("mutate", "words"), [
    (lambda b: b.pop("tokens"), "no generated `tokens`"),
    (lambda b: b.pop("completion_probabilities"), "no `completion_probabilities`"),
    (lambda b: b["completion_probabilities"].pop(), "reported 1 probability entries"),
    (lambda b: b["completion_probabilities"][0].update(id=3), "is not the token"),
    (lambda b: b["tokens"].__setitem__(0, 9), "not a token id in [0, 4)"),
    (lambda b: b["completion_probabilities"][0]["top_logprobs"][0].update(logprob=2.0),
     "not a log-probability"),
    (lambda b: b["completion_probabilities"][0]["top_logprobs"][0].update(logprob="x"),
     "is not a number"),
    (lambda b: b["completion_probabilities"][1].update(top_logprobs=None), "not a list"),
])
def test_a_malformed_answer_is_named(mutate: Any, words: str) -> None:
    body = _body([0, 3], [[(0, 0.0)], [(3, 0.0)]])
    mutate(body)
    with pytest.raises(ServerApiError, match=None) as failure:
        parse_distributions(body, 4, BYTES)
    assert words in str(failure.value)


_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
                     lambda inner: st.lists(inner, max_size=4)
                     | st.dictionaries(st.text(max_size=5), inner, max_size=4), max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(body=st.dictionaries(st.sampled_from(["tokens", "completion_probabilities", "x"]),
                            _json, max_size=3))
def test_any_answer_parses_or_is_a_named_error(body: dict[str, Any]) -> None:
    with contextlib.suppress(ServerApiError):
        parse_distributions(body, 4, BYTES)


def test_figures_are_llama_perplexitys() -> None:
    reference = np.log(np.array([[0.5, 0.25, 0.25], [0.9, 0.05, 0.05]]))
    server = np.log(np.array([[0.25, 0.5, 0.25], [0.9, 0.05, 0.05]]))
    figures = position_figures([7, 8], server, reference)
    # KL(reference || server) = 0.5 ln 2 + 0.25 ln 0.5 = 0.25 ln 2.
    assert figures[0].kld == pytest.approx(0.25 * math.log(2))
    assert (figures[0].server_top, figures[0].reference_top) == (1, 0)
    assert figures[0].max_abs_dp == pytest.approx(0.25)
    assert figures[1].kld == pytest.approx(0.0)
    summary = summarize(figures)
    assert summary.top1_agreement == 0.5
    assert summary.max_kld == pytest.approx(0.25 * math.log(2))


def test_a_failure_names_fixture_position_tokens_and_limit() -> None:
    reference = np.log(np.array([[0.7, 0.1, 0.1, 0.1]] * 4))
    server = np.log(np.array([[0.7, 0.1, 0.1, 0.1]] * 2 + [[0.2, 0.1, 0.1, 0.6]]
                             + [[0.1, 0.1, 0.1, 0.7]]))
    figures = position_figures([100, 101, 102, 103], server, reference)
    limit = threshold(WeightType.F32, "f16")
    lines = judge("bench (f32 weights, KV f16)", figures, summarize(figures), limit, BYTES)
    assert len(lines) == 2
    kld, top = lines
    assert kld.startswith("bench (f32 weights, KV f16): KL divergence from the reference")
    assert "at position 103" in kld
    assert "2 of 4 positions over, 1 allowed" in kld
    assert "server b'b' (id 3), reference b'a' (id 0)" in kld
    assert f"exceeds {limit.max_kld:g}" in kld
    assert "agrees with the reference at 50% of 4 positions" in top
    assert "first difference at position 102" in top


def test_one_position_over_the_limit_is_allowed() -> None:
    """A near tie in a quantized MoE router moves one position on a correct build."""
    reference = np.log(np.array([[0.7, 0.1, 0.1, 0.1]] * 20))
    server = reference.copy()
    server[7] = np.log([0.1, 0.1, 0.1, 0.7])
    figures = position_figures(list(range(20)), server, reference)
    assert judge("x", figures, summarize(figures), threshold(WeightType.F32, "f16"),
                 BYTES) == []


def test_agreeing_figures_pass() -> None:
    rows = np.log(np.array([[0.7, 0.1, 0.1, 0.1]] * 3))
    figures = position_figures([1, 2, 3], rows, rows)
    assert judge("x", figures, summarize(figures), threshold(WeightType.Q4_0, "q4_0"),
                 BYTES) == []


@pytest.mark.parametrize("weight_type", list(WeightType))
def test_every_weight_and_kv_type_has_a_limit_that_widens_with_coarser_kv(
        weight_type: WeightType) -> None:
    limits = [threshold(weight_type, kv) for kv in KV_TYPES]
    assert all(a.max_kld <= b.max_kld for a, b in itertools.pairwise(limits))
    assert all(0 < limit.min_top1 <= 1 for limit in limits)


def test_a_partial_row_lumps_the_unlisted_tokens() -> None:
    reference = np.log(np.array([[0.5, 0.3, 0.1, 0.1]]))
    # The server listed its top two; the other 0.2 is "the rest" on both sides.
    server = np.array([[math.log(0.4), math.log(0.4), -np.inf, -np.inf]])
    (figure,) = position_figures([5], server, reference)
    want = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.4) + 0.2 * math.log(0.2 / 0.2)
    assert figure.kld == pytest.approx(want)
    assert figure.max_abs_dp == pytest.approx(0.1)


def _print(tokens: list[int], rows: list[list[tuple[int, float]] | None]) -> Fingerprint:
    return Fingerprint(tuple(tokens), tuple(None if r is None else tuple(r) for r in rows))


HALF = math.log(0.5)
SAME = _print([1, 2, 3], [[(1, HALF), (2, HALF)], [(2, 0.0)], [(3, 0.0)]])


def test_a_build_against_itself_is_unchanged() -> None:
    result = compare_fingerprints([SAME, SAME], [SAME, SAME])
    assert result.verdict is NumericsVerdict.UNCHANGED
    assert result.band_kld == 0.0
    assert result.limit == KLD_FLOOR


def test_moved_log_probs_are_a_change_past_the_floor() -> None:
    moved = _print([1, 2, 3], [[(1, math.log(0.6)), (2, math.log(0.4))], [(2, 0.0)],
                               [(3, 0.0)]])
    result = compare_fingerprints([SAME], [moved])
    assert result.verdict is NumericsVerdict.CHANGED
    assert result.change is not None
    assert result.change.at == 0
    assert result.change.max_kld == pytest.approx(0.5 * math.log(0.5 / 0.6)
                                                  + 0.5 * math.log(0.5 / 0.4))
    assert "at generated position 0 exceeds 1e-05" in result.reason
    assert result.as_json()["verdict"] == "changed"


def test_a_noisy_build_widens_its_own_band() -> None:
    """Two starts of one build that differ (a GPU's reduction order) set the band: a
    change within ten times it is not one."""
    wobble = _print([1, 2, 3], [[(1, math.log(0.501)), (2, math.log(0.499))], [(2, 0.0)],
                                [(3, 0.0)]])
    result = compare_fingerprints([SAME, wobble], [wobble])
    assert result.band_kld > KLD_FLOOR / BAND_FACTOR
    assert result.verdict is NumericsVerdict.UNCHANGED


def test_positions_after_the_tokens_part_are_not_compared() -> None:
    # Position 1 differs in its token; its distribution (same prefix) is compared, the
    # one after it follows another prefix and is not.
    parted = _print([1, 9, 3], [[(1, HALF), (2, HALF)], [(2, -0.7), (9, -0.69)],
                                [(3, -5.0)]])
    change = divergence(SAME, parted)
    assert change.first_difference == 1
    assert change.at == 1
    assert math.isfinite(change.max_kld)


def test_no_fingerprint_is_not_measured() -> None:
    result = compare_fingerprints([], [SAME])
    assert result.verdict is NumericsVerdict.NOT_MEASURED


def test_a_fingerprint_round_trips_through_json() -> None:
    assert fingerprint_from_json(SAME.as_json()) == SAME
    with pytest.raises(ServerApiError, match="not a numerics fingerprint"):
        fingerprint_from_json({"tokens": [1]})


#: The eval callback's print of three tensors (common/debug.cpp's format, shortened
#: values): a float tensor, a quantized one (header only), a norm.
DUMP = (Path(__file__).parent / "data" / "eval_callback" / "dump.txt").read_text()


def test_a_dump_reads_every_tensor_in_graph_order() -> None:
    tensors = parse_dump("some log line\n" + DUMP)
    assert [(t.name, t.op, t.type) for t in tensors] == [
        ("embd", "GET_ROWS", "f32"), ("blk.0.attn_q.weight", "NONE", "q4_0"),
        ("norm-0", "RMS_NORM", "f32")]
    assert tensors[0].values == (0.5, -0.25, 1.0, 0.0, 0.125, 0.125, -1.0, 2.0)
    assert tensors[0].sum == 2.75
    assert (tensors[1].values, tensors[1].sum) == ((), None)  # quantized: no print


def test_the_first_tensor_that_differs_is_named() -> None:
    moved = DUMP.replace("0.8000,      -0.4000", "0.8080,      -0.4000").replace(
        "sum = 3.200000", "sum = 3.208000")
    found = first_difference(parse_dump(DUMP), parse_dump(moved))
    assert found is not None
    assert found.index == 2
    assert found.describe() == ("the first tensor that differs is norm-0 (RMS_NORM, 4, 2, 1, 1), "
                                "node 2 of the graph: 1 of 8 printed values differ, the first "
                                "0.8000 against 0.8080")


def test_a_print_within_its_precision_or_cut_short_is_no_difference() -> None:
    rounded = DUMP.replace("sum = 3.200000", "sum = 3.200001")
    assert first_difference(parse_dump(DUMP), parse_dump(rounded)) is None
    cut = DUMP[:DUMP.index("common_debug_cb_eval:                   norm-0")]
    assert first_difference(parse_dump(DUMP), parse_dump(cut)) is None


def test_a_print_cut_before_the_last_tensor_is_not_taken_for_agreement() -> None:
    """The q4-dot error is in the graph's last tensor only: a print that ends before it
    once read as "every tensor agrees" (a fresh-clone CI run under load)."""
    last = DUMP.replace("norm-0 = (f32)   RMS_NORM(embd",
                        f"{LAST_TENSOR} = (f32)   MUL_MAT(embd")
    whole = parse_dump(DUMP + last)
    assert whole[-1].name == LAST_TENSOR
    assert compare_prints(whole, whole) is None
    with pytest.raises(BuildError, match=r"agree, but the candidate build's print ended "
                       r"after 3 tensors \(norm-0\), before the graph's last "
                       r"\(result_output\)"):
        compare_prints(whole, whole[:3])
    with pytest.raises(BuildError, match="the baseline build's print ended after 0 tensors "
                       "and the candidate build's"):
        compare_prints([], whole[:5])
    moved = parse_dump(DUMP.replace("sum = 3.200000", "sum = 3.300000"))
    found = compare_prints(whole, moved)  # a difference before the cut stands
    assert found is not None
    assert found.candidate.name == "norm-0"


def test_a_value_printed_twice_is_a_garbled_print_not_a_difference() -> None:
    """The undrained tool once wrote one value twice as it exited (kqv_out-5 in place of
    result_output): the tensor's values shift, but their count tells it from a change."""
    twice = parse_dump(DUMP.replace("0.8000,", "0.8000,       0.8000,", 1))
    with pytest.raises(BuildError, match=r"the prints of norm-0 \(node 2\) hold 8 and 9 "
                       "values for the same shape: a print is garbled"):
        compare_prints(parse_dump(DUMP), twice)


def test_graphs_that_part_are_named() -> None:
    other = DUMP.replace("RMS_NORM(embd", "NORM(embd")
    found = first_difference(parse_dump(DUMP), parse_dump(other))
    assert found is not None
    assert "the graphs part here: the baseline computes norm-0 (RMS_NORM" in found.why


@settings(max_examples=300, deadline=None)
@given(text=st.lists(st.sampled_from([
    "common_debug_cb_eval: x = (f32) ADD(a{1}, b{1}) = {1, 1, 1, 1}", "    [", "    ]",
    "    sum = 1.500000", "    sum = abc", "            [      0.1000, nan, -inf  ],",
    "garbage", "", "common_debug_cb_eval: broken ="]), max_size=30).map("\n".join))
def test_any_print_parses(text: str) -> None:
    tensors = parse_dump(text)
    assert first_difference(tensors, tensors) is None


def test_a_kquant_copy_needs_a_kquant_type_and_a_tool_a_cmake_folder(tmp_path: Path) -> None:
    with pytest.raises(FixtureError, match="'Q4_0' is not a K-quant type"):
        kquant_copy(tmp_path / "m.gguf", "Q4_0", tmp_path / "llama-quantize", tmp_path)
    with pytest.raises(BuildError, match="has no CMake folder to build llama-quantize"):
        build_tool(tmp_path, "llama-quantize")
