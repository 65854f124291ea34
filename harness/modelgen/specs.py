"""Fixture specs: one JSON file per tiny GGUF model, parsed into frozen value objects.

A spec is either a *model* (shape, vocab and seed of a GGUF the writer generates) or a
*truncated copy* of another fixture (a corrupt file for the drafter-fallback path).
Everything the writer needs is checked here, so a spec that loads is a spec that writes.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from harness import strictjson as sj
from harness.errors import FixtureError, UnknownFixtureError


class Architecture(enum.StrEnum):
    """Architectures the writer can lay out; values are gguf's own names (MODEL_ARCH_NAMES)."""

    LLAMA = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    GEMMA2 = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GEMMA2]
    GLM4_MOE = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GLM4_MOE]

    @property
    def model_arch(self) -> Any:
        """The ``gguf.MODEL_ARCH`` member, to look up tensor names and allowed tensors."""
        return next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == self.value)


class VocabKind(enum.StrEnum):
    """The two vocabularies the vocab builder knows (see ``harness.modelgen.vocab``)."""

    SPM_BYTES = "spm-bytes"
    SPM_FOREIGN = "spm-foreign"


@dataclass(frozen=True)
class ModelShape:
    """The shape of a generated model; names follow the GGUF keys they are written to.

    ``block_count`` is the GGUF block count: the trunk plus any trailing ``nextn`` (MTP)
    blocks, exactly as llama.cpp reads it.
    """

    architecture: Architecture
    block_count: int
    context_length: int
    embedding_length: int
    feed_forward_length: int
    head_count: int
    head_count_kv: int
    vocab: VocabKind
    seed: int
    head_dim: int | None = None
    rope_dimension_count: int | None = None
    expert_count: int = 0
    expert_used_count: int = 0
    expert_feed_forward_length: int | None = None
    expert_shared_count: int | None = None
    leading_dense_block_count: int | None = None
    nextn_predict_layers: int = 0
    sliding_window: int | None = None
    aligned_token: str | None = None

    @property
    def trunk_block_count(self) -> int:
        return self.block_count - self.nextn_predict_layers

    @property
    def key_length(self) -> int:
        """Per-head width: explicit, else llama.cpp's default ``n_embd / n_head``."""
        return (
            self.head_dim
            if self.head_dim is not None
            else (self.embedding_length // self.head_count)
        )


@dataclass(frozen=True)
class Truncation:
    """A fixture that is the first ``fraction`` of another fixture's bytes."""

    source: str
    fraction: float


@dataclass(frozen=True)
class FixtureSpec:
    """One fixture: exactly one of ``shape`` (generated) or ``truncation`` (cut copy)."""

    name: str
    description: str
    path: Path
    shape: ModelShape | None = None
    truncation: Truncation | None = None


_COMMON_KEYS = ("description",)
_MODEL_REQUIRED = (
    "architecture",
    "block_count",
    "context_length",
    "embedding_length",
    "feed_forward_length",
    "head_count",
    "head_count_kv",
    "vocab",
    "seed",
)
_MODEL_OPTIONAL = (
    "head_dim",
    "rope_dimension_count",
    "expert_count",
    "expert_used_count",
    "expert_feed_forward_length",
    "expert_shared_count",
    "leading_dense_block_count",
    "nextn_predict_layers",
    "sliding_window",
    "aligned_token",
)
_TRUNCATED_KEYS = ("truncated_copy_of", "truncate_to_fraction")


def load_fixture_spec(path: Path) -> FixtureSpec:
    """Parse and validate one spec file; the fixture's name is the file's stem."""
    obj = sj.read_object(path)
    name = path.stem
    if "truncated_copy_of" in obj:
        sj.check_keys(path, obj, (*_COMMON_KEYS, *_TRUNCATED_KEYS), ())
        trunc = Truncation(
            source=sj.get_str(path, obj, "truncated_copy_of"),
            fraction=sj.get_fraction(path, obj, "truncate_to_fraction"),
        )
        return FixtureSpec(name, sj.get_str(path, obj, "description"), path, truncation=trunc)
    sj.check_keys(
        path, obj, (*_COMMON_KEYS, *_MODEL_REQUIRED), (*_MODEL_OPTIONAL, *_TRUNCATED_KEYS)
    )
    if "truncate_to_fraction" in obj:
        raise FixtureError(f"{path}: 'truncate_to_fraction' needs 'truncated_copy_of'")
    shape = _parse_shape(path, obj)
    _validate_shape(path, shape)
    return FixtureSpec(name, sj.get_str(path, obj, "description"), path, shape=shape)


def _parse_shape(path: Path, obj: Mapping[str, Any]) -> ModelShape:
    return ModelShape(
        architecture=Architecture(sj.get_choice(path, obj, "architecture", list(Architecture))),
        block_count=sj.get_int(path, obj, "block_count", minimum=1),
        context_length=sj.get_int(path, obj, "context_length", minimum=1),
        embedding_length=sj.get_int(path, obj, "embedding_length", minimum=1),
        feed_forward_length=sj.get_int(path, obj, "feed_forward_length", minimum=1),
        head_count=sj.get_int(path, obj, "head_count", minimum=1),
        head_count_kv=sj.get_int(path, obj, "head_count_kv", minimum=1),
        vocab=VocabKind(sj.get_choice(path, obj, "vocab", list(VocabKind))),
        seed=sj.get_int(path, obj, "seed"),
        head_dim=sj.get_opt_int(path, obj, "head_dim", minimum=1),
        rope_dimension_count=sj.get_opt_int(path, obj, "rope_dimension_count", minimum=2),
        expert_count=sj.get_int(path, obj, "expert_count", default=0),
        expert_used_count=sj.get_int(path, obj, "expert_used_count", default=0),
        expert_feed_forward_length=sj.get_opt_int(
            path, obj, "expert_feed_forward_length", minimum=1
        ),
        expert_shared_count=sj.get_opt_int(path, obj, "expert_shared_count"),
        leading_dense_block_count=sj.get_opt_int(path, obj, "leading_dense_block_count"),
        nextn_predict_layers=sj.get_int(path, obj, "nextn_predict_layers", default=0),
        sliding_window=sj.get_opt_int(path, obj, "sliding_window", minimum=1),
        aligned_token=sj.get_opt_str(path, obj, "aligned_token"),
    )


def _validate_shape(path: Path, s: ModelShape) -> None:
    """Cross-field rules: the ones llama.cpp's loader would otherwise reject at start-up."""

    def fail(why: str) -> None:
        raise FixtureError(f"{path}: {why}")

    if s.head_count % s.head_count_kv:
        fail(f"head_count {s.head_count} is not a multiple of head_count_kv {s.head_count_kv}")
    if s.head_dim is None and s.embedding_length % s.head_count:
        fail("embedding_length must be a multiple of head_count (or set head_dim)")
    if s.rope_dimension_count is not None and s.rope_dimension_count > s.key_length:
        fail(f"rope_dimension_count {s.rope_dimension_count} exceeds head width {s.key_length}")
    if (s.expert_count == 0) != (s.expert_used_count == 0):
        fail("expert_count and expert_used_count must both be 0 or both be > 0")
    if s.expert_used_count > s.expert_count:
        fail("expert_used_count exceeds expert_count")
    if s.sliding_window is not None and s.architecture is not Architecture.GEMMA2:
        fail("sliding_window is only written for gemma2 (the writer's SWA architecture)")
    if s.architecture is Architecture.GEMMA2:
        if s.sliding_window is None:
            fail("gemma2 needs 'sliding_window' (the windowed-KV case it exists for)")
        if s.aligned_token is not None:
            # gemma2 ties its output to token_embd, so one row cannot be aimed alone.
            fail("aligned_token is not supported for gemma2 (tied output embeddings)")
    if s.architecture is Architecture.GLM4_MOE:
        _validate_glm4moe(path, s)
    elif s.nextn_predict_layers or s.leading_dense_block_count is not None:
        fail("nextn_predict_layers / leading_dense_block_count are glm4moe-only here")


def _validate_glm4moe(path: Path, s: ModelShape) -> None:
    # From the measured MTP recipe (DESIGN "Measured facts"): llama.cpp's glm4moe
    # graph asserts a single MTP block, and the MTP block must be an MoE block.
    missing = [
        key
        for key, value in (
            ("expert_feed_forward_length", s.expert_feed_forward_length),
            ("expert_shared_count", s.expert_shared_count),
            ("leading_dense_block_count", s.leading_dense_block_count),
        )
        if value is None
    ]
    if missing:
        raise FixtureError(f"{path}: glm4moe needs {', '.join(missing)}")
    if s.expert_count == 0:
        raise FixtureError(f"{path}: glm4moe needs expert_count > 0")
    if s.nextn_predict_layers > 1:
        raise FixtureError(f"{path}: llama.cpp's glm4moe supports one MTP block only")
    if s.trunk_block_count < 1:
        raise FixtureError(f"{path}: block_count must exceed nextn_predict_layers")
    assert s.leading_dense_block_count is not None  # checked just above
    if s.leading_dense_block_count > s.trunk_block_count:
        raise FixtureError(f"{path}: leading_dense_block_count exceeds the trunk blocks")


def load_fixture_specs(spec_dir: Path) -> dict[str, FixtureSpec]:
    """All specs in ``spec_dir``, keyed by name, in name order (the "spec order")."""
    paths = sorted(spec_dir.glob("*.json"), key=lambda p: p.stem)
    specs = {p.stem: load_fixture_spec(p) for p in paths}
    if not specs:
        raise FixtureError(f"{spec_dir}: no fixture specs (*.json) found")
    for spec in specs.values():
        if spec.truncation is not None:
            source = specs.get(spec.truncation.source)
            if source is None:
                raise UnknownFixtureError(
                    f"{spec.path}: truncated_copy_of {spec.truncation.source!r} is not a "
                    f"fixture; known fixtures: {', '.join(specs)}"
                )
            if source.truncation is not None:
                raise FixtureError(f"{spec.path}: the source of a truncated copy must be a model")
    return specs
