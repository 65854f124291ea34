"""Read a GGUF file into metadata and float32 arrays, with gguf-py alone.

Every tensor is dequantized once by ``gguf.quants.dequantize`` (exact for every ggml
type gguf-py knows: F32, F16, BF16, Q4_0 ... Q8_0, the K-quants) into an owned float32
array in numpy order, i.e. ggml's ``ne`` reversed: ggml ``{n_embd, n_vocab}`` is numpy
``(n_vocab, n_embd)``, an expert stack ``{n_embd, n_ff, n_expert}`` is
``(n_expert, n_ff, n_embd)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import numpy as np
from numpy.typing import NDArray

from harness.errors import FixtureError, ModelFileError

#: A metadata value as gguf-py's ``ReaderField.contents()`` gives it.
MetaValue = int | float | bool | str | list[object]


@dataclass(frozen=True)
class GgufContents:
    """One GGUF file, read: its path, architecture, metadata and dequantized tensors."""

    path: Path
    architecture: str
    metadata: Mapping[str, MetaValue]
    tensors: Mapping[str, NDArray[np.float32]]


def read_gguf(path: Path) -> GgufContents:
    """Read ``path``; a file gguf-py cannot parse or dequantize raises a FixtureError."""
    try:
        reader = gguf.GGUFReader(path)
    except FileNotFoundError as exc:
        raise FixtureError(f"{path}: no such GGUF file") from exc
    except (ValueError, OSError, IndexError, KeyError) as exc:
        raise ModelFileError(f"{path}: not a readable GGUF file ({exc})") from exc
    metadata: dict[str, MetaValue] = {}
    for name, field in reader.fields.items():
        # The vocabulary is the tokenizer's business, not the forward pass's: skipping it
        # saves seconds on a real model's 50k-entry token and merge lists.
        if name.startswith(("GGUF.", "tokenizer.")):
            continue
        metadata[name] = field.contents()
    arch = metadata.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelFileError(f"{path}: no general.architecture key")
    tensors: dict[str, NDArray[np.float32]] = {}
    for tensor in reader.tensors:
        tensors[tensor.name] = _dequantize(path, tensor)
    return GgufContents(path=path, architecture=arch, metadata=metadata, tensors=tensors)


def _dequantize(path: Path, tensor: Any) -> NDArray[np.float32]:
    """One ``gguf.ReaderTensor`` as an owned float32 array in numpy order."""
    try:
        flat = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
    except NotImplementedError as exc:
        raise FixtureError(
            f"{path}: tensor {tensor.name} has type {tensor.tensor_type.name}, which "
            "gguf-py cannot dequantize, so the reference cannot read it"
        ) from exc
    shape = tuple(int(n) for n in reversed(tensor.shape.tolist()))
    return np.array(flat, dtype=np.float32).reshape(shape)
