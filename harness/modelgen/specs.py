"""Fixture specs: one JSON file per tiny GGUF model, parsed into frozen value objects.

A spec is either a *model* (shape, vocab and seed of a GGUF the writer generates), a
*quantized copy* of another model (the same weights, written in a quantized type), or a
*truncated copy* of another fixture (a corrupt file for the drafter-fallback path).
Everything the writer needs is checked here, so a spec that loads is a spec that writes:
keys, types and what each architecture needs by resources/schemas/fixture-spec.schema.json, the
arithmetic between fields and the names of other fixtures in code, in the same words.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf

from harness.data_schema import fail_if_any, load_json, problem, schema_file
from harness.errors import FixtureError, UnknownFixtureError


class Architecture(enum.StrEnum):
    """Architectures the writer can lay out; values are gguf's own names (MODEL_ARCH_NAMES)."""

    LLAMA = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.LLAMA]
    GEMMA2 = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GEMMA2]
    GLM4_MOE = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GLM4_MOE]
    #: Gemma 4 with per-layer embeddings: the tensor llama.cpp reads lazily.
    GEMMA4 = gguf.MODEL_ARCH_NAMES[gguf.MODEL_ARCH.GEMMA4]

    @property
    def model_arch(self) -> Any:
        """The ``gguf.MODEL_ARCH`` member, to look up tensor names and allowed tensors."""
        return next(a for a, n in gguf.MODEL_ARCH_NAMES.items() if n == self.value)


class WeightProfile(enum.StrEnum):
    """How the writer draws a model's weights (``harness.modelgen.weights``).

    ``flat``: every matrix uniform in ±0.05, so the output is a nearly flat distribution;
    the aligned-token trick needs that. ``peaked``: matrices scaled by their fan-in and a
    wide output layer, so next-token distributions look like a trained model's (a few
    nats of entropy, clear top tokens that change with the context): a build that
    computes a wrong number changes them visibly.
    """

    FLAT = "flat"
    PEAKED = "peaked"


class WeightType(enum.StrEnum):
    """The ggml types a fixture's matrices are written in; 1-D tensors and the MoE router
    stay F32, as llama-quantize leaves them. Quantized by gguf-py's own routines."""

    F32 = "f32"
    Q8_0 = "q8_0"
    Q4_0 = "q4_0"
    Q4_1 = "q4_1"

    @property
    def ggml_type(self) -> Any:
        """The ``gguf.GGMLQuantizationType`` member."""
        return gguf.GGMLQuantizationType[self.name]

    @property
    def file_type(self) -> Any:
        """The ``gguf.LlamaFileType`` the file's ``general.file_type`` records."""
        return (gguf.LlamaFileType.ALL_F32 if self is WeightType.F32
                else gguf.LlamaFileType[f"MOSTLY_{self.name}"])


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
    #: Gemma 4's per-layer embedding width (``embedding_length_per_layer_input``).
    embedding_length_per_layer: int | None = None
    aligned_token: str | None = None
    weights: WeightProfile = WeightProfile.FLAT

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
    """One fixture: exactly one of ``shape`` (generated) or ``truncation`` (cut copy).

    A quantized copy is generated: it has its source's ``shape`` and seed, so its weights
    are the source's, written in ``weight_type``; ``quantized_from`` names the source.
    """

    name: str
    description: str
    path: Path
    shape: ModelShape | None = None
    truncation: Truncation | None = None
    weight_type: WeightType = WeightType.F32
    quantized_from: str | None = None


#: The spec format: which keys, of which types, for which architecture.
SCHEMA = schema_file("fixture-spec")
_FIX = "fixtures/models/README.md (Spec fields) describes every key"


def load_fixture_spec(path: Path) -> FixtureSpec:
    """Parse and validate one spec file; the fixture's name is the file's stem."""
    obj: Mapping[str, Any] = load_json(path, SCHEMA, FixtureError, fix=_FIX)
    name = path.stem
    if "truncated_copy_of" in obj:
        trunc = Truncation(source=obj["truncated_copy_of"],
                           fraction=float(obj["truncate_to_fraction"]))
        return FixtureSpec(name, obj["description"], path, truncation=trunc)
    if "quantized_copy_of" in obj:
        # The shape is the source's, filled in by load_fixture_specs once all are read.
        return FixtureSpec(name, obj["description"], path,
                           weight_type=WeightType(obj["weight_type"]),
                           quantized_from=obj["quantized_copy_of"])
    shape = _shape(obj)
    fail_if_any(FixtureError, _shape_problems(path, shape), _FIX)
    return FixtureSpec(name, obj["description"], path, shape=shape)


def _shape(obj: Mapping[str, Any]) -> ModelShape:
    """The shape in a spec the schema accepted (a JSON integer may arrive as 2.0)."""

    def count(key: str, default: int = 0) -> int:
        return int(obj.get(key, default))

    def optional(key: str) -> int | None:
        return None if key not in obj else int(obj[key])

    return ModelShape(
        architecture=Architecture(obj["architecture"]),
        block_count=count("block_count"),
        context_length=count("context_length"),
        embedding_length=count("embedding_length"),
        feed_forward_length=count("feed_forward_length"),
        head_count=count("head_count"),
        head_count_kv=count("head_count_kv"),
        vocab=VocabKind(obj["vocab"]),
        seed=count("seed"),
        head_dim=optional("head_dim"),
        rope_dimension_count=optional("rope_dimension_count"),
        expert_count=count("expert_count"),
        expert_used_count=count("expert_used_count"),
        expert_feed_forward_length=optional("expert_feed_forward_length"),
        expert_shared_count=optional("expert_shared_count"),
        leading_dense_block_count=optional("leading_dense_block_count"),
        nextn_predict_layers=count("nextn_predict_layers"),
        sliding_window=optional("sliding_window"),
        embedding_length_per_layer=optional("embedding_length_per_layer"),
        aligned_token=obj.get("aligned_token"),
        weights=WeightProfile(obj.get("weights", WeightProfile.FLAT.value)),
    )


def _shape_problems(path: Path, s: ModelShape) -> list[str]:
    """Rules across fields that a schema cannot state: the ones llama.cpp's loader would
    otherwise reject at start-up. (Which keys an architecture needs is the schema's.)"""
    found: list[str] = []

    def refuse(key: str, value: object, why: str, allowed: str) -> None:
        found.append(problem(path, f"$.{key}", value, why, allowed))

    if s.head_count % s.head_count_kv:
        refuse("head_count", s.head_count, f"not a multiple of head_count_kv {s.head_count_kv}",
               f"a multiple of {s.head_count_kv} (grouped-query attention)")
    if s.head_dim is None and s.embedding_length % s.head_count:
        refuse("embedding_length", s.embedding_length,
               f"not a multiple of head_count {s.head_count}",
               f"a multiple of {s.head_count} (or set head_dim)")
    if s.rope_dimension_count is not None and s.rope_dimension_count > s.key_length:
        refuse("rope_dimension_count", s.rope_dimension_count,
               f"exceeds the head width {s.key_length}", f"<= {s.key_length}")
    if (s.expert_count == 0) != (s.expert_used_count == 0):
        key, value = (("expert_used_count", s.expert_used_count) if s.expert_count
                      else ("expert_count", s.expert_count))
        refuse(key, value, "expert_count and expert_used_count must both be 0 or both be > 0",
               f"1 to {s.expert_count}" if s.expert_count else
               f">= {s.expert_used_count}, or expert_used_count 0")
    elif s.expert_used_count > s.expert_count:
        refuse("expert_used_count", s.expert_used_count,
               f"exceeds expert_count {s.expert_count}", f"1 to {s.expert_count}")
    if s.aligned_token is not None and s.weights is WeightProfile.PEAKED:
        refuse("weights", s.weights.value, "an aligned token needs the flat profile: its "
               "shared direction must dominate every residual stream", "flat, or no "
               "aligned_token")
    if s.architecture is Architecture.GLM4_MOE:
        # From the measured MTP recipe (docs/design.md, "Drafters and MTP"): the MTP block follows a
        # trunk of at least one block, which holds the leading dense blocks. (One MoE MTP
        # block at most, and the keys glm4moe needs, are the schema's rules.)
        if s.trunk_block_count < 1:
            refuse("block_count", s.block_count,
                   f"not more than nextn_predict_layers {s.nextn_predict_layers}",
                   f"> {s.nextn_predict_layers} (the trunk needs a block)")
        elif (s.leading_dense_block_count or 0) > s.trunk_block_count:
            refuse("leading_dense_block_count", s.leading_dense_block_count,
                   f"exceeds the {s.trunk_block_count} trunk blocks "
                   "(block_count - nextn_predict_layers)", f"<= {s.trunk_block_count}")
    return found


def load_fixture_specs(spec_dir: Path) -> dict[str, FixtureSpec]:
    """All specs in ``spec_dir``, keyed by name, in name order (the "spec order")."""
    paths = sorted(spec_dir.glob("*.json"), key=lambda p: p.stem)
    specs = {p.stem: load_fixture_spec(p) for p in paths}
    if not specs:
        raise FixtureError(f"{spec_dir}: no fixture specs (*.json) found")
    models = ", ".join(json.dumps(n) for n, s in specs.items() if s.shape is not None)
    for name, spec in list(specs.items()):
        if spec.quantized_from is not None:
            specs[name] = _quantized_copy(spec, specs, models)
    for spec in specs.values():
        if spec.truncation is None:
            continue
        source = specs.get(spec.truncation.source)
        if source is None or source.truncation is not None:
            why = "not a fixture" if source is None else "a truncated copy itself"
            line = problem(spec.path, "$.truncated_copy_of", spec.truncation.source,
                           f"{why}; the source of a truncated copy must be a model",
                           f"one of {models} (the model fixtures)")
            fail_if_any(UnknownFixtureError if source is None else FixtureError, [line])
    return specs


def _quantized_copy(spec: FixtureSpec, specs: Mapping[str, FixtureSpec],
                    models: str) -> FixtureSpec:
    """``spec`` with its source's shape; the source must be a generated f32 model whose
    every quantized row is a whole number of the type's blocks."""
    assert spec.quantized_from is not None
    source = specs.get(spec.quantized_from)
    if source is None or source.shape is None or source.quantized_from is not None:
        why = ("not a fixture" if source is None else
               "a copy itself; the source of a quantized copy must be a generated model")
        line = problem(spec.path, "$.quantized_copy_of", spec.quantized_from, why,
                       f"one of {models} (the generated f32 models)")
        fail_if_any(UnknownFixtureError if source is None else FixtureError, [line])
    assert source is not None
    assert source.shape is not None
    block = gguf.GGML_QUANT_SIZES[spec.weight_type.ggml_type][0]
    widths = {source.shape.embedding_length, source.shape.feed_forward_length,
              source.shape.head_count * source.shape.key_length}
    if source.shape.expert_feed_forward_length is not None:
        widths.add(source.shape.expert_feed_forward_length)
    odd = sorted(w for w in widths if w % block)
    if odd:
        fail_if_any(FixtureError, [problem(
            spec.path, "$.weight_type", spec.weight_type.value,
            f"rows of {', '.join(map(str, odd))} values in {spec.quantized_from!r} are not "
            f"whole {block}-value blocks", "f32, or a source whose widths are multiples "
            f"of {block}")])
    return FixtureSpec(spec.name, spec.description, spec.path, shape=source.shape,
                       weight_type=spec.weight_type, quantized_from=spec.quantized_from)
