"""Where a GGUF file is damaged: a byte walk over the header that names the offset.

``gguf.GGUFReader`` fails on a damaged file with whatever numpy raised; this walk reads
the header the way the GGUF spec lays it out and reports the first field that does not
fit, so the error can say "offset N: …" instead of a numpy message.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

import gguf

_K = gguf.Keys
_V = gguf.GGUFValueType
#: Bytes of each scalar GGUF value type (the GGUF spec).
_SCALAR_BYTES: dict[Any, int] = {
    _V.UINT8: 1, _V.INT8: 1, _V.BOOL: 1, _V.UINT16: 2, _V.INT16: 2, _V.UINT32: 4,
    _V.INT32: 4, _V.FLOAT32: 4, _V.UINT64: 8, _V.INT64: 8, _V.FLOAT64: 8,
}
_MAX_DIMS = 4  # GGML_MAX_DIMS
_SUPPORTED_VERSIONS = (2, 3)


class _Damage(Exception):
    def __init__(self, offset: int, what: str) -> None:
        super().__init__(f"offset {offset}: {what}")


class _Cursor:
    """Little-endian reads over the file that fail with where and what ran short."""

    def __init__(self, buf: mmap.mmap, size: int) -> None:
        self.buf = buf
        self.size = size
        self.pos = 0

    def take(self, n: int, what: str) -> int:
        start = self.pos
        if n > self.size - start:
            raise _Damage(start, f"the file ends inside {what} ({n} bytes needed, "
                                 f"{self.size - start} left)")
        self.pos += n
        return start

    def u32(self, what: str) -> int:
        return int(struct.unpack_from("<I", self.buf, self.take(4, what))[0])

    def u64(self, what: str) -> int:
        return int(struct.unpack_from("<Q", self.buf, self.take(8, what))[0])

    def string(self, what: str) -> str:
        n = self.u64(f"the length of {what}")
        start = self.take(n, what)
        return bytes(self.buf[start:start + n]).decode("utf-8", errors="replace")


def locate_damage(path: Path, file_size: int) -> str | None:
    """Walk the header's structure; say where the file stops being a GGUF, or None."""
    try:
        with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0,
                                                  access=mmap.ACCESS_READ) as buf:
            _walk(_Cursor(buf, file_size))
    except _Damage as damage:
        return str(damage)
    except (OSError, ValueError):
        return None
    return None


def _walk(cur: _Cursor) -> None:
    magic = cur.u32("the GGUF magic")
    if magic != gguf.GGUF_MAGIC:
        raw = struct.pack("<I", magic)
        raise _Damage(0, f"the file does not start with the GGUF magic b'GGUF' (found {raw!r})")
    version = cur.u32("the GGUF version")
    if version not in _SUPPORTED_VERSIONS:
        raise _Damage(4, f"unsupported GGUF version {version}")
    n_tensors = cur.u64("the tensor count")
    n_kv = cur.u64("the key/value count")
    alignment = gguf.GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        start = cur.pos
        name = cur.string(f"the name of key #{i}")
        what = f"key '{name}' (#{i}, at offset {start})"
        value = _skip_value(cur, cur.u32(f"the value type of {what}"), what)
        if name == _K.General.ALIGNMENT and value:
            alignment = value
    infos: list[tuple[str, int, int]] = []
    for i in range(n_tensors):
        start = cur.pos
        name = cur.string(f"the name of tensor info #{i}")
        what = f"tensor info '{name}' (#{i}, at offset {start})"
        n_dims = cur.u32(f"the dimension count of {what}")
        if n_dims > _MAX_DIMS:
            raise _Damage(start, f"{what} claims {n_dims} dimensions (at most {_MAX_DIMS})")
        elements = 1
        for d in range(n_dims):
            elements *= cur.u64(f"dimension {d} of {what}")
        type_at = cur.pos
        raw_type = cur.u32(f"the type of {what}")
        try:
            block, type_bytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType(raw_type)]
        except (ValueError, KeyError):
            raise _Damage(type_at, f"{what} has unknown tensor type {raw_type}") from None
        offset = cur.u64(f"the data offset of {what}")
        infos.append((name, offset, elements * type_bytes // block))
    data_start = -(-cur.pos // alignment) * alignment
    for name, offset, n_bytes in infos:
        begin = data_start + offset
        if begin + n_bytes > cur.size:
            raise _Damage(begin, f"tensor '{name}' needs {n_bytes} bytes up to offset "
                                 f"{begin + n_bytes}, but the file ends at offset {cur.size}")


def _skip_value(cur: _Cursor, raw_type: int, what: str, depth: int = 0) -> int:
    """Step over one value; return it when it is an unsigned 32-bit scalar (alignment)."""
    type_at = cur.pos - 4
    try:
        vtype = _V(raw_type)
    except ValueError:
        raise _Damage(type_at, f"{what} has unknown value type {raw_type}") from None
    if vtype in _SCALAR_BYTES:
        start = cur.take(_SCALAR_BYTES[vtype], f"the value of {what}")
        return int(struct.unpack_from("<I", cur.buf, start)[0]) if vtype == _V.UINT32 else 0
    if vtype == _V.STRING:
        cur.string(f"the value of {what}")
        return 0
    if depth > 8:
        raise _Damage(type_at, f"{what} nests arrays deeper than any GGUF writer does")
    item_type = cur.u32(f"the item type of {what}")
    count = cur.u64(f"the item count of {what}")
    try:
        item_vtype = _V(item_type)
    except ValueError:
        raise _Damage(cur.pos - 12, f"{what} has unknown item type {item_type}") from None
    if item_vtype in _SCALAR_BYTES:
        cur.take(count * _SCALAR_BYTES[item_vtype], f"the {count} items of {what}")
        return 0
    for i in range(count):
        _skip_value(cur, item_type, f"item {i} of {what}", depth + 1)
    return 0
