"""Which tensors a launch reads lazily from the GGUF, and what that takes off the resident
weights (pure).

The pinned loader marks a few tensors ``TENSOR_READ_LAZY`` (gemma4's and qwen4exp's
per-layer token embeddings: src/models/gemma4.cpp, qwen4exp.cpp); ``--lazy-mode`` decides
which of them are read row by row from the mapped file instead of being kept resident
(src/llama-model-loader.cpp ``lazy_read::add``): ``on`` every one, ``auto`` (the default)
those over 4 GiB, ``off`` none. Each one read lazily is logged as
``tensor NAME (size = N MiB) lazy read enabled``, which is how a launch is verified. The
runtime in docs/references.md (reference 002) deducts such "row-addressable embeddings
read lazily from the GGUF" from its resident estimate, and so does the planner.

Not modelled: ``auto`` falls back to ``off`` where a device has no mmap support (some
integrated GPUs, src/llama-model.cpp); the cards the harness plans for all map files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from harness.facts.build import Capabilities
from harness.facts.gpu import LazyMode
from harness.planning.build_support import accepts_flag

LAZY_FLAG = "--lazy-mode"
#: Architecture → the tensors its loader marks for lazy reading.
LAZY_READ_TENSORS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "gemma4": ("per_layer_token_embd.weight",),
    "qwen4exp": ("per_layer_token_embd.weight",),
})
#: ``auto`` reads a marked tensor lazily only when it is larger than this
#: (``auto_min_size`` in ``lazy_read::add``: 4 GiB, strictly larger).
AUTO_MIN_BYTES = 4 << 30


@dataclass(frozen=True)
class LazyPlan:
    """The tensors the server will read lazily, their bytes, and why."""

    mode: LazyMode | None
    tensors: tuple[str, ...]
    lazy_bytes: int
    reason: str


def plan_lazy(marked: tuple[tuple[str, int], ...], mode: LazyMode | None,
              capabilities: Capabilities, *, auto_min_bytes: int = AUTO_MIN_BYTES) -> LazyPlan:
    """The lazy reads of a model whose loader marks ``marked`` (name, bytes) under
    ``mode`` (None: the server's default, ``auto``) on a build with ``capabilities``."""
    if not accepts_flag(capabilities, LAZY_FLAG):
        return LazyPlan(mode, (), 0, f"the build has no {LAZY_FLAG}: it keeps every tensor "
                                     "resident")
    effective = mode or LazyMode.AUTO
    if effective is LazyMode.OFF:
        chosen: tuple[tuple[str, int], ...] = ()
    elif effective is LazyMode.ON:
        chosen = marked
    else:
        chosen = tuple((name, size) for name, size in marked if size > auto_min_bytes)
    lazy_bytes = sum(size for _, size in chosen)
    said = f"{LAZY_FLAG} {effective}" + ("" if mode else " (the default)")
    if chosen:
        names = ", ".join(f"{name} ({size >> 20} MiB)" for name, size in chosen)
        reason = f"{said}: read lazily, not resident: {names}"
    elif marked:
        reason = (f"{said}: no tensor read lazily (the marked ones, "
                  f"{', '.join(n for n, _ in marked)}, stay resident)")
    else:
        reason = f"{said}: the model has no tensor its loader reads lazily"
    return LazyPlan(mode, tuple(name for name, _ in chosen), lazy_bytes, reason)
