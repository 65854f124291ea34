"""Typed access to a GGUF header's key/value fields (pure over ``GGUFReader.fields``).

Integers, strings, bool arrays and per-layer values are read the way llama.cpp's
``get_key``, ``get_arr`` and ``get_key_or_arr`` read them, and every error names the
file, the key and the offset of its field, so a bad header says where it is bad.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import gguf

from harness.errors import ModelFileError

_K = gguf.Keys
_V = gguf.GGUFValueType

# Two keys the pinned llama.cpp reads that gguf 0.19's ``Keys`` does not name yet
# (src/llama-arch.cpp: LLM_KV_NUM_LOOPS, LLM_KV_ATTENTION_RECURRENT_LAYERS). A newer
# gguf's own constant wins when it has one.
NUM_LOOPS_KEY: str = getattr(_K.LLM, "NUM_LOOPS", "{arch}.num_loops")
RECURRENT_LAYERS_KEY: str = getattr(
    _K.Attention, "RECURRENT_LAYERS", "{arch}.attention.recurrent_layers"
)

_INT_TYPES = frozenset({_V.UINT8, _V.INT8, _V.UINT16, _V.INT16, _V.UINT32, _V.INT32,
                        _V.UINT64, _V.INT64})
_BOOLISH_TYPES = _INT_TYPES | {_V.BOOL}

#: Formats a gguf key template with the model's architecture.
KeyFor = Callable[[str], str]


class GgufHeader:
    """Typed access to the header's key/value fields; errors name the key and offset."""

    def __init__(self, path: Path, reader: Any) -> None:
        self._path = path
        self._fields: dict[str, Any] = dict(reader.fields)

    def has(self, key: str) -> bool:
        return key in self._fields

    def invalid(self, key: str, problem: str) -> ModelFileError:
        field = self._fields.get(key)
        where = f" at offset {field.offset}" if field is not None else ""
        return ModelFileError(f"{self._path}: GGUF key '{key}'{where} {problem}")

    def missing(self, key: str, why: str = "llama.cpp requires it to load the model",
                ) -> ModelFileError:
        return ModelFileError(f"{self._path}: GGUF key '{key}' is missing; {why}")

    def _describe(self, field: Any) -> str:
        return "/".join(t.name for t in field.types) or "nothing"

    def string(self, key: str) -> str:
        field = self._fields.get(key)
        if field is None:
            raise self.missing(key)
        if field.types != [_V.STRING]:
            raise self.invalid(key, f"holds {self._describe(field)}, expected a string")
        return str(field.contents())

    def optional_integer(self, key: str) -> int | None:
        field = self._fields.get(key)
        if field is None:
            return None
        if len(field.types) != 1 or field.types[0] not in _INT_TYPES:
            raise self.invalid(key, f"holds {self._describe(field)}, expected an integer")
        return int(field.contents())

    def integer(self, key: str, default: int | None = None) -> int:
        value = self.optional_integer(key)
        if value is not None:
            return value
        if default is None:
            raise self.missing(key)
        return default

    def flags(self, key: str) -> tuple[bool, ...] | None:
        """A bool (or integer) array key, as llama.cpp's ``get_arr`` reads it; else None."""
        field = self._fields.get(key)
        if field is None or field.types[0] != _V.ARRAY:
            return None
        if field.types[1:] and field.types[-1] not in _BOOLISH_TYPES:
            raise self.invalid(key, f"holds {self._describe(field)}, expected bools")
        return tuple(bool(v) for v in field.contents())

    def per_layer(self, key: str, n: int, default: tuple[int, ...]) -> tuple[int, ...]:
        """A scalar repeated for every layer, or an array of exactly ``n`` items
        (``get_key_or_arr``)."""
        field = self._fields.get(key)
        if field is None:
            return default
        if field.types[0] != _V.ARRAY:
            return (self.integer(key),) * n
        if field.types[1:] and field.types[-1] not in _INT_TYPES:
            raise self.invalid(key, f"holds {self._describe(field)}, expected integers")
        values = tuple(int(v) for v in field.contents())
        if len(values) != n:
            raise self.invalid(key, f"has {len(values)} items, expected one per layer ({n})")
        return values

    def array_length(self, key: str) -> int | None:
        field = self._fields.get(key)
        if field is None or field.types[0] != _V.ARRAY:
            return None
        return len(field.data)
