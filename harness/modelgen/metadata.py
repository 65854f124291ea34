"""GGUF key/value metadata for a fixture: hyperparameters through gguf's writer helpers.

Every key goes through a ``GGUFWriter.add_*`` method, so key strings come from
``gguf.Keys`` and are formatted with the architecture by gguf itself.
"""

from __future__ import annotations

import gguf

from harness.modelgen.specs import Architecture, ModelShape, WeightType
from harness.modelgen.vocab import Vocab, add_vocab

#: llama.cpp requires the RMS-norm epsilon key for all three architectures.
RMS_NORM_EPS = 1e-5

#: gemma2's published soft-capping values; llama.cpp reads them when present.
_GEMMA2_ATTN_SOFTCAP = 50.0
_GEMMA2_FINAL_SOFTCAP = 30.0


def add_metadata(writer: gguf.GGUFWriter, name: str, shape: ModelShape, vocab: Vocab,
                 weight_type: WeightType = WeightType.F32) -> None:
    # No dates, UUIDs or paths: the file must hash the same on every run.
    writer.add_name(f"harness fixture {name}")
    writer.add_file_type(weight_type.file_type)
    writer.add_context_length(shape.context_length)
    writer.add_embedding_length(shape.embedding_length)
    writer.add_block_count(shape.block_count)
    writer.add_feed_forward_length(shape.feed_forward_length)
    writer.add_head_count(shape.head_count)
    writer.add_head_count_kv(shape.head_count_kv)
    writer.add_layer_norm_rms_eps(RMS_NORM_EPS)
    if shape.head_dim is not None:
        writer.add_key_length(shape.head_dim)
        writer.add_value_length(shape.head_dim)
    if shape.rope_dimension_count is not None:
        writer.add_rope_dimension_count(shape.rope_dimension_count)
    _add_experts(writer, shape)
    if shape.architecture is Architecture.GEMMA2:
        assert shape.sliding_window is not None  # validated by specs
        writer.add_sliding_window(shape.sliding_window)
        writer.add_attn_logit_softcapping(_GEMMA2_ATTN_SOFTCAP)
        writer.add_final_logit_softcapping(_GEMMA2_FINAL_SOFTCAP)
    if shape.architecture is Architecture.GEMMA4:
        _add_gemma4(writer, shape)
    add_vocab(writer, vocab)


def _add_gemma4(writer: gguf.GGUFWriter, shape: ModelShape) -> None:
    """The keys src/models/gemma4.cpp requires: the window and which layers use it
    (every other one, the last full), the sliding layers' head widths and the per-layer
    embedding width."""
    assert shape.sliding_window is not None  # validated by specs
    assert shape.embedding_length_per_layer is not None
    writer.add_sliding_window(shape.sliding_window)
    writer.add_sliding_window_pattern([bid % 2 == 0 and bid < shape.block_count - 1
                                       for bid in range(shape.block_count)])
    writer.add_key_length_swa(shape.key_length)
    writer.add_value_length_swa(shape.key_length)
    writer.add_embedding_length_per_layer_input(shape.embedding_length_per_layer)


def _add_experts(writer: gguf.GGUFWriter, shape: ModelShape) -> None:
    if shape.expert_count:
        writer.add_expert_count(shape.expert_count)
        writer.add_expert_used_count(shape.expert_used_count)
    if shape.expert_feed_forward_length is not None:
        writer.add_expert_feed_forward_length(shape.expert_feed_forward_length)
    if shape.expert_shared_count is not None:
        writer.add_expert_shared_count(shape.expert_shared_count)
    if shape.leading_dense_block_count is not None:
        writer.add_leading_dense_block_count(shape.leading_dense_block_count)
    if shape.architecture is Architecture.GLM4_MOE:
        # The measured GLM-4.5 routing recipe (docs/design.md): sigmoid gates, normalised, scale 1.
        writer.add_expert_weights_scale(1.0)
        writer.add_expert_weights_norm(True)
        writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)
    if shape.nextn_predict_layers:
        writer.add_nextn_predict_layers(shape.nextn_predict_layers)
