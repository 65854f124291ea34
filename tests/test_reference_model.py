"""The numpy reference forward (``harness/reference/``): llama.cpp's rules on hand-worked
cases, the causal and sliding-window plumbing on tiny written models, and the loader's
errors. No server: the comparison against llama-server is a suite's job.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np
import pytest
from numpy.typing import NDArray

from harness import modelgen
from harness.errors import FixtureError
from harness.reference import load_reference
from harness.reference.attention import attention, kq_mask
from harness.reference.hparams import swa_flags
from harness.reference.moe import Experts, Gating, Routing, moe_ffn, route
from harness.reference.ops import gelu_tanh, log_softmax, rms_norm, softcap
from harness.reference.rope import RopeType, apply_rope, rope_angles

F64 = NDArray[np.float64]

# --- RoPE: which dims pair up -----------------------------------------------------------


def _rope(x: list[float], pos: int, n_rot: int, kind: RopeType, base: float = 10000.0) -> F64:
    head = np.array(x, dtype=np.float64).reshape(1, 1, -1)
    out: F64 = apply_rope(head, rope_angles([pos], n_rot, base), kind)[0, 0]
    return out


def test_rope_norm_rotates_adjacent_pairs() -> None:
    # head 4, pos 1, base 10000: theta = 1 for pair 0 and 10000^(-2/4) = 0.01 for pair 1.
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    out = _rope([1, 2, 3, 4], 1, 4, RopeType.NORM)
    expected = [1 * c1 - 2 * s1, 1 * s1 + 2 * c1, 3 * c2 - 4 * s2, 3 * s2 + 4 * c2]
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_rope_neox_rotates_dims_half_a_rotation_apart() -> None:
    c1, s1, c2, s2 = math.cos(1), math.sin(1), math.cos(0.01), math.sin(0.01)
    out = _rope([1, 2, 3, 4], 1, 4, RopeType.NEOX)
    expected = [1 * c1 - 3 * s1, 2 * c2 - 4 * s2, 1 * s1 + 3 * c1, 2 * s2 + 4 * c2]
    np.testing.assert_allclose(out, expected, rtol=1e-12)


def test_partial_neox_rope_leaves_the_dims_past_n_rot_alone() -> None:
    # glm4moe: rope.dimension_count 2 of a 4-wide head; the pair is (0, 1), theta = pos.
    out = _rope([1, 2, 3, 4], 3, 2, RopeType.NEOX)
    c, s = math.cos(3), math.sin(3)
    np.testing.assert_allclose(out, [c - 2 * s, s + 2 * c, 3, 4], rtol=1e-12)


def test_rope_is_the_identity_at_position_zero_and_uses_the_base() -> None:
    np.testing.assert_allclose(_rope([1, 2, 3, 4], 0, 4, RopeType.NORM), [1, 2, 3, 4])
    # base 100 makes pair 1's angle 100^(-1/2) = 0.1 at position 1.
    out = _rope([0, 0, 1, 0], 1, 4, RopeType.NORM, base=100.0)
    np.testing.assert_allclose(out[2:], [math.cos(0.1), math.sin(0.1)], rtol=1e-12)


# --- the KQ mask and the sliding window ---------------------------------------------------


def test_causal_mask_hides_only_later_keys() -> None:
    allowed = kq_mask(4)
    assert allowed.tolist() == [
        [True, False, False, False],
        [True, True, False, False],
        [True, True, True, False],
        [True, True, True, True],
    ]


def test_sliding_window_masks_a_key_at_distance_equal_to_the_window() -> None:
    # is_masked_swa (STANDARD): masked when p1 - p0 >= n_swa, so window 2 keeps the
    # query itself and one key before it.
    allowed = kq_mask(5, sliding_window=2)
    seen = [np.flatnonzero(row).tolist() for row in allowed]
    assert seen == [[0], [0, 1], [1, 2], [2, 3], [3, 4]]


def test_swa_layer_pattern_follows_set_swa_pattern() -> None:
    # gemma2: period 2, dense_first false -> the even layers are SWA.
    assert swa_flags(4, 2, dense_first=False) == (True, False, True, False)
    assert swa_flags(6, 3, dense_first=False) == (True, True, False, True, True, False)
    assert swa_flags(4, 2, dense_first=True) == (False, True, False, True)
    assert swa_flags(3, 0, dense_first=False) == (True, True, True)


def test_attention_groups_query_heads_onto_kv_heads_in_order() -> None:
    # 4 query heads on 2 KV heads: heads 0, 1 read KV head 0 and heads 2, 3 read KV head 1.
    q = np.zeros((1, 4, 2))
    k = np.zeros((1, 2, 2))
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    out = attention(q, k, v, kq_scale=1.0, allowed=kq_mask(1))
    assert out.tolist() == [[1.0, 2.0, 1.0, 2.0, 3.0, 4.0, 3.0, 4.0]]


def test_each_query_head_attends_through_its_own_kv_head() -> None:
    # KV head 0's keys favour token 0, KV head 1's favour token 1; v[t, h] = 10 t + h + 1.
    # At position 1, query heads 0-1 (KV head 0) return ~v[0, 0] = 1 and heads 2-3 (KV
    # head 1) ~v[1, 1] = 12.
    q = np.ones((2, 4, 1))
    k = np.array([[[100.0], [0.0]], [[0.0], [100.0]]])
    v = np.array([[[1.0], [2.0]], [[11.0], [12.0]]])
    out = attention(q, k, v, kq_scale=1.0, allowed=kq_mask(2))
    np.testing.assert_allclose(out[1], [1.0, 1.0, 12.0, 12.0], rtol=1e-9)


def test_attention_soft_cap_bounds_the_scores() -> None:
    # Two keys with scores 0 and 1000: uncapped, the second takes everything; capped at
    # 50 it scores 50 * tanh(20) ~= 50, still far ahead but a finite, known amount.
    q = np.array([[[1.0]], [[1.0]]])
    k = np.array([[[0.0]], [[1000.0]]])
    v = np.array([[[0.0]], [[1.0]]])
    out = attention(q, k, v, kq_scale=1.0, allowed=kq_mask(2), softcap=50.0)
    capped = 50.0 * math.tanh(20.0)
    assert out[1, 0] == pytest.approx(math.exp(capped) / (1 + math.exp(capped)))
    assert softcap(np.array([30.0]), 30.0)[0] == pytest.approx(30 * math.tanh(1.0))


# --- MoE routing --------------------------------------------------------------------------


def test_softmax_routing_takes_the_top_k_and_renormalizes() -> None:
    # llama: softmax over all experts, top-2, norm_w=true, no scale.
    logits = np.log(np.array([[1.0, 2.0, 3.0, 4.0]]))
    routing = Routing(Gating.SOFTMAX, n_expert=4, n_expert_used=2, norm_weights=True,
                      weights_scale=0.0)
    selected, weights = route(logits, routing)
    assert selected.tolist() == [[3, 2]]
    np.testing.assert_allclose(weights, [[4 / 7, 3 / 7]])
    raw = Routing(Gating.SOFTMAX, 4, 2, norm_weights=False, weights_scale=0.0)
    np.testing.assert_allclose(route(logits, raw)[1], [[0.4, 0.3]])


def test_sigmoid_routing_selects_with_the_bias_but_weighs_without_it() -> None:
    # glm4moe: probs = sigmoid(logits) = [.5, .75, .25, .5]; scores with exp_probs_b
    # [0, 0, 1, .1] = [.5, .75, 1.25, .6] pick experts 2 and 1; their weights are the
    # unbiased .25 and .75, normalized (sum 1) then scaled by 2.
    logits = np.array([[0.0, math.log(3), -math.log(3), 0.0]])
    bias = np.array([0.0, 0.0, 1.0, 0.1])
    routing = Routing(Gating.SIGMOID, 4, 2, norm_weights=True, weights_scale=2.0)
    selected, weights = route(logits, routing, bias)
    assert selected.tolist() == [[2, 1]]
    np.testing.assert_allclose(weights, [[0.5, 1.5]])
    assert route(logits, routing)[0].tolist() == [[1, 0]]


def test_renormalization_clamps_a_tiny_weight_sum() -> None:
    # build_moe_ffn clamps the sum at 6.103515625e-5 before dividing.
    logits = np.array([[-30.0, -30.0]])
    routing = Routing(Gating.SIGMOID, 2, 2, norm_weights=True, weights_scale=1.0)
    _, weights = route(logits, routing)
    expected = 1.0 / (1.0 + math.exp(30.0)) / 6.103515625e-5
    np.testing.assert_allclose(weights, [[expected, expected]])


def test_moe_ffn_weighs_each_chosen_expert() -> None:
    # One-dim experts: gate 1 (so the hidden value is silu(x) * up), up e + 1, down 1.
    n_expert = 3
    gate = np.full((n_expert, 1, 1), 1.0)
    up = np.arange(1.0, n_expert + 1).reshape(n_expert, 1, 1)
    down = np.ones((n_expert, 1, 1))
    x = np.array([[2.0], [2.0]])
    selected = np.array([[2, 0], [1, 2]])
    weights = np.array([[0.75, 0.25], [0.5, 0.5]])
    out = moe_ffn(x, (selected, weights), Experts(gate, up, down))
    silu2 = 2.0 / (1.0 + math.exp(-2.0))
    np.testing.assert_allclose(out[:, 0], [silu2 * 2 * (0.75 * 3 + 0.25 * 1),
                                          silu2 * 2 * (0.5 * 2 + 0.5 * 3)])


# --- the elementwise pieces -----------------------------------------------------------------


def test_norm_gelu_and_log_softmax_are_the_textbook_functions() -> None:
    x = np.array([[3.0, -4.0]])
    np.testing.assert_allclose(rms_norm(x, np.array([1.0, 2.0]), 0.0),
                               [[3 / math.sqrt(12.5), -8 / math.sqrt(12.5)]])
    g = 0.5 * (1 + math.tanh(math.sqrt(2 / math.pi) * (1 + 0.044715)))
    assert gelu_tanh(np.array([1.0]))[0] == pytest.approx(g, rel=1e-12)
    np.testing.assert_allclose(np.exp(log_softmax(np.array([[0.0, math.log(3)]]))), [[0.25, 0.75]])


# --- tiny written models --------------------------------------------------------------------


def _write_model(
    path: Path, arch: str, keys: Mapping[str, object], tensors: Mapping[str, F64]
) -> Path:
    writer = gguf.GGUFWriter(path, arch)
    for name, value in keys.items():
        key = f"{arch}.{name}"
        if isinstance(value, bool):
            writer.add_bool(key, value)
        elif isinstance(value, int):
            writer.add_uint32(key, value)
        else:
            assert isinstance(value, float)
            writer.add_float32(key, value)
    for name, array in tensors.items():
        writer.add_tensor(name, array.astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


N_EMBD, N_HEAD, N_KV, N_FF, N_VOCAB = 8, 2, 1, 16, 11
HEAD = N_EMBD // N_HEAD


def _attention_block(rng: np.random.Generator, il: int) -> dict[str, F64]:
    def r(*shape: int) -> F64:
        return rng.uniform(-0.5, 0.5, shape)

    return {
        f"blk.{il}.attn_norm.weight": np.ones(N_EMBD),
        f"blk.{il}.attn_q.weight": r(N_HEAD * HEAD, N_EMBD),
        f"blk.{il}.attn_k.weight": r(N_KV * HEAD, N_EMBD),
        f"blk.{il}.attn_v.weight": r(N_KV * HEAD, N_EMBD),
        f"blk.{il}.attn_output.weight": r(N_EMBD, N_HEAD * HEAD),
        f"blk.{il}.ffn_gate.weight": r(N_FF, N_EMBD),
        f"blk.{il}.ffn_up.weight": r(N_FF, N_EMBD),
        f"blk.{il}.ffn_down.weight": r(N_EMBD, N_FF),
    }


BASE_KEYS: dict[str, object] = {
    "block_count": 1,
    "embedding_length": N_EMBD,
    "attention.head_count": N_HEAD,
    "attention.head_count_kv": N_KV,
    "attention.layer_norm_rms_epsilon": 1e-5,
}


def _tiny_llama(path: Path, *, tied: bool) -> Path:
    rng = np.random.default_rng(3)
    tensors = {"token_embd.weight": rng.uniform(-1, 1, (N_VOCAB, N_EMBD)),
               **_attention_block(rng, 0),
               "blk.0.ffn_norm.weight": np.ones(N_EMBD),
               "output_norm.weight": np.ones(N_EMBD)}
    if not tied:
        tensors["output.weight"] = rng.uniform(-1, 1, (N_VOCAB, N_EMBD))
    return _write_model(path, "llama", BASE_KEYS, tensors)


def _tiny_gemma2_all_swa(path: Path, window: int) -> Path:
    # sliding_window_pattern 0: every layer is SWA (set_swa_pattern with n_pattern 0).
    rng = np.random.default_rng(4)
    tensors = {"token_embd.weight": rng.uniform(-1, 1, (N_VOCAB, N_EMBD)),
               **_attention_block(rng, 0),
               "blk.0.post_attention_norm.weight": np.ones(N_EMBD),
               "blk.0.ffn_norm.weight": np.ones(N_EMBD),
               "blk.0.post_ffw_norm.weight": np.ones(N_EMBD),
               "output_norm.weight": np.ones(N_EMBD)}
    keys = {**BASE_KEYS, "attention.sliding_window": window, "attention.sliding_window_pattern": 0}
    return _write_model(path, "gemma2", keys, tensors)


def test_logits_are_causal_and_log_probs_normalize(tmp_path: Path) -> None:
    model = load_reference(_tiny_llama(tmp_path / "llama.gguf", tied=False))
    tokens = [1, 5, 2, 9, 4, 4, 7]
    full = model.logits(tokens)
    assert full.shape == (7, N_VOCAB)
    assert full.dtype == np.float64
    np.testing.assert_allclose(model.logits(tokens[:3]), full[:3], rtol=1e-12)
    changed = model.logits([*tokens[:4], 0, 0, 0])
    np.testing.assert_allclose(changed[:4], full[:4], rtol=1e-12)
    assert not np.allclose(changed[4:], full[4:])
    np.testing.assert_allclose(np.exp(model.log_probs(tokens)).sum(axis=1), 1.0)


def test_a_llama_without_output_weight_reads_token_embd(tmp_path: Path) -> None:
    tied = load_reference(_tiny_llama(tmp_path / "tied.gguf", tied=True))
    assert tied.n_vocab == N_VOCAB
    assert tied.architecture == "llama"
    hidden_norm = tied.weights.get("output_norm.weight")
    assert hidden_norm.shape == (N_EMBD,)
    np.testing.assert_array_equal(tied.weights.output(), tied.weights.get("token_embd.weight"))


def test_a_windowed_layer_forgets_a_token_once_it_leaves_the_window(tmp_path: Path) -> None:
    window = 3
    model = load_reference(_tiny_gemma2_all_swa(tmp_path / "swa.gguf", window))
    assert model.hparams.swa_layers == (True,)
    a = model.logits([1, 2, 3, 4, 5, 6])
    b = model.logits([8, 2, 3, 4, 5, 6])
    # Position 2 still sees position 0 (distance 2 < 3); position 3 no longer does.
    assert not np.allclose(a[2], b[2])
    np.testing.assert_allclose(a[window:], b[window:], rtol=1e-12)
    # gemma2's final soft-cap bounds every logit by 30.
    assert np.abs(a).max() < 30.0


def test_gemma2_scales_the_embeddings_by_sqrt_n_embd(tmp_path: Path) -> None:
    # With every attention and FFN weight 0 the blocks add nothing (the post-norms of a
    # zero vector are 0), so logits = softcap(rms_norm(sqrt(n_embd) * e) . E). Embeddings
    # of size 1e-3 make the RMS epsilon (1e-5) matter, so the scale shows.
    rng = np.random.default_rng(6)
    embd = rng.uniform(-1e-3, 1e-3, (N_VOCAB, N_EMBD))
    zero_block = {name: np.zeros_like(t) for name, t in _attention_block(rng, 0).items()}
    tensors = {"token_embd.weight": embd, **zero_block,
               "blk.0.attn_norm.weight": np.ones(N_EMBD),
               "blk.0.post_attention_norm.weight": np.ones(N_EMBD),
               "blk.0.ffn_norm.weight": np.ones(N_EMBD),
               "blk.0.post_ffw_norm.weight": np.ones(N_EMBD),
               "output_norm.weight": np.ones(N_EMBD)}
    model = load_reference(_write_model(tmp_path / "flat.gguf", "gemma2", BASE_KEYS, tensors))
    e = embd.astype(np.float32).astype(np.float64)
    x = e[[3, 7]] * math.sqrt(N_EMBD)
    rms_eps = float(np.float32(1e-5))
    normed = x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + rms_eps)
    expected = 30.0 * np.tanh(normed @ e.T / 30.0)
    np.testing.assert_allclose(model.logits([3, 7]), expected, rtol=1e-9)


# --- loader errors --------------------------------------------------------------------------


def test_an_unknown_architecture_names_the_file(tmp_path: Path) -> None:
    path = _write_model(tmp_path / "mamba.gguf", "mamba", BASE_KEYS,
                        {"token_embd.weight": np.zeros((N_VOCAB, N_EMBD))})
    with pytest.raises(FixtureError, match=r"mamba\.gguf.*architecture 'mamba' is not supported"):
        load_reference(path)


def test_a_missing_tensor_names_the_file_and_the_tensor(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    block = _attention_block(rng, 0)
    del block["blk.0.attn_k.weight"]
    path = _write_model(tmp_path / "holey.gguf", "llama", BASE_KEYS, {
        "token_embd.weight": np.zeros((N_VOCAB, N_EMBD)), **block,
        "blk.0.ffn_norm.weight": np.ones(N_EMBD), "output_norm.weight": np.ones(N_EMBD)})
    missing = r"holey\.gguf: tensor blk\.0\.attn_k\.weight is missing"
    with pytest.raises(FixtureError, match=missing):
        load_reference(path)


def test_a_missing_required_key_or_file_is_a_fixture_error(tmp_path: Path) -> None:
    keys = {k: v for k, v in BASE_KEYS.items() if k != "attention.layer_norm_rms_epsilon"}
    path = _write_model(tmp_path / "noeps.gguf", "llama", keys,
                        {"token_embd.weight": np.zeros((N_VOCAB, N_EMBD)),
                         "output_norm.weight": np.ones(N_EMBD)})
    with pytest.raises(FixtureError, match=r"noeps\.gguf.*layer_norm_rms_epsilon"):
        load_reference(path)
    with pytest.raises(FixtureError, match=r"absent\.gguf"):
        load_reference(tmp_path / "absent.gguf")


# --- the shipped fixtures ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "arch", "n_layer"),
    [("dense", "llama", 2), ("moe", "llama", 2), ("swa", "gemma2", 2), ("mtp", "glm4moe", 2)],
)
def test_every_architecture_fixture_runs(
    fixture_set: modelgen.FixtureSet, name: str, arch: str, n_layer: int
) -> None:
    model = load_reference(fixture_set.model(name))
    assert (model.architecture, model.n_vocab, model.hparams.n_layer) == (arch, 269, n_layer)
    log_probs = model.log_probs(list(range(1, 41)))
    assert log_probs.shape == (40, 269)
    np.testing.assert_allclose(np.exp(log_probs).sum(axis=1), 1.0)
