"""What the planner knows about a model, read from its GGUF header (``probes/gguf_facts``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LayerBytes:
    """Tensor bytes of one block, split the way offload planning needs them.

    ``expert``: the routed-expert FFN tensors (``ffn_*_exps``) that ``--n-cpu-moe``
    moves to system RAM; ``dense_ffn``: the dense FFN tensors (``ffn_gate/up/down`` and
    shared experts) that ``--n-cpu-ffn`` moves; ``other``: attention, norms, router.
    """

    index: int
    expert: int
    dense_ffn: int
    other: int

    @property
    def total(self) -> int:
        return self.expert + self.dense_ffn + self.other


@dataclass(frozen=True)
class SsmFacts:
    """Sizes of a state-space / linear-attention block (``ssm.*`` GGUF keys)."""

    conv_kernel: int
    inner_size: int
    state_size: int
    group_count: int
    time_step_rank: int


@dataclass(frozen=True)
class ModelFacts:
    """The GGUF header facts a launch plan depends on. Per-layer tuples have block_count items."""

    path: str
    file_size: int
    architecture: str
    block_count: int
    context_length: int
    embedding_length: int
    head_count: int
    #: KV heads per layer (a scalar key is expanded; 0 marks a layer without attention).
    head_count_kv: tuple[int, ...]
    key_length: int
    value_length: int
    vocab_size: int
    sliding_window: int | None = None
    #: True for each layer that uses the sliding window.
    swa_layers: tuple[bool, ...] = ()
    #: Trailing layers that reuse an earlier layer's KV cache instead of their own.
    shared_kv_layers: int = 0
    #: Every Nth layer is full attention in a linear-attention hybrid (None: not hybrid).
    full_attention_interval: int | None = None
    ssm: SsmFacts | None = None
    expert_count: int = 0
    expert_used_count: int = 0
    nextn_predict_layers: int = 0
    layer_bytes: tuple[LayerBytes, ...] = ()
    #: Bytes outside the blocks: token embeddings, output head, final norm.
    non_layer_bytes: int = 0
    #: The output matrix every decoded token reads in full: ``output.weight``, or
    #: ``token_embd.weight`` when the model ties them (0: not read from a file).
    output_bytes: int = 0
    #: Per-head K/V widths of the sliding-window layers when they differ from the full
    #: layers' (``attention.key_length_swa``/``value_length_swa``, Gemma 4); None: same.
    key_length_swa: int | None = None
    value_length_swa: int | None = None
    #: True for each layer that keeps a recurrent (SSM / linear-attention) state instead
    #: of a K/V cache, as llama.cpp marks it (``is_recr``); empty: no such layer.
    recurrent_layers: tuple[bool, ...] = ()
    #: A looped transformer replays its ``block_count`` blocks this many times, and
    #: llama.cpp gives every replayed layer its own K/V cache (``num_loops``).
    loop_count: int = 1
    #: Why the KV planner cannot size this model's memory exactly (an MLA, sparse-index or
    #: non-Mamba recurrent cache, ...); None when it can.
    kv_unmodelled: str | None = None
    #: The tensors this architecture's loader may read lazily (``TENSOR_READ_LAZY``), with
    #: their bytes: ``harness.planning.lazy_tensors`` decides which are.
    lazy_marked: tuple[tuple[str, int], ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.expert_count > 0

    @property
    def has_mtp_head(self) -> bool:
        return self.nextn_predict_layers > 0
