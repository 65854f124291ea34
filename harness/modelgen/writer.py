"""The deterministic GGUF writer: a fixture spec in, a byte-stable ``.gguf`` file out.

Same spec, same bytes, on every run: metadata and tensors are added in a fixed order,
weights come from the spec's seed (``harness.modelgen.rng``), and nothing time- or
machine-dependent is written.
"""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import numpy.typing as npt

from harness.errors import FixtureError
from harness.modelgen.metadata import add_metadata
from harness.modelgen.specs import FixtureSpec, WeightType
from harness.modelgen.tensors import plan_tensors
from harness.modelgen.vocab import build_vocab
from harness.modelgen.weights import build_weights

#: Bump when the writer's output changes for an unchanged spec: it is part of the cache
#: key, and sha256.json must then be regenerated (``harness fixtures --record``).
WRITER_VERSION = "1"

#: Tensors a quantized copy keeps in F32, as llama-quantize does: 1-D tensors (norms,
#: biases) and the MoE router, whose few values decide which experts run.
_KEEP_F32_SUFFIXES = ("ffn_gate_inp.weight",)


def write_model(spec: FixtureSpec, path: Path) -> None:
    """Write the generated model of ``spec`` to ``path`` (overwriting it)."""
    shape = spec.shape
    if shape is None:
        raise FixtureError(f"{spec.path}: {spec.name!r} is a truncated copy, not a model")
    vocab = build_vocab(shape.vocab)
    writer = gguf.GGUFWriter(path=None, arch=shape.architecture.value)
    add_metadata(writer, spec.name, shape, vocab, spec.weight_type)
    for name, value in build_weights(shape, vocab, plan_tensors(shape, len(vocab.tokens))):
        _add_tensor(writer, name, value, spec.weight_type)
    try:
        writer.write_header_to_file(path)
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()


def _add_tensor(writer: gguf.GGUFWriter, name: str, value: npt.NDArray[np.float32],
                weight_type: WeightType) -> None:
    if (weight_type is WeightType.F32 or value.ndim < 2
            or name.endswith(_KEEP_F32_SUFFIXES)):
        writer.add_tensor(name, value)
        return
    qtype = weight_type.ggml_type
    writer.add_tensor(name, gguf.quants.quantize(value, qtype), raw_dtype=qtype)


def write_truncated(spec: FixtureSpec, source: Path, path: Path) -> None:
    """Write the first ``fraction`` of ``source``'s bytes: a GGUF cut short mid-data."""
    trunc = spec.truncation
    if trunc is None:
        raise FixtureError(f"{spec.path}: {spec.name!r} is a model, not a truncated copy")
    data = source.read_bytes()
    path.write_bytes(data[: int(len(data) * trunc.fraction)])
