"""The bytes each token id stands for, read from a GGUF's own tokenizer arrays.

Two vocabulary kinds are covered: SentencePiece (``llama``: ``<0xAB>`` byte tokens, ``▁``
for a space) — the fixtures' — and GPT-2 byte-level BPE (``gpt2``: every byte mapped to a
printable character by GPT-2's table) — the real model's. Control and unknown tokens
stand for no bytes (the server prints none for them).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import gguf

from harness.errors import FixtureError

_SP = "\u2581"


@cache
def _gpt2_byte_of_char() -> dict[str, int]:
    """GPT-2's reversible table: printable bytes map to themselves, the rest to code
    points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    extra = 0
    for byte in range(256):
        if byte not in printable:
            table[chr(256 + extra)] = byte
            extra += 1
    return table


def _spm_bytes(text: str, kind: int) -> bytes:
    if kind == gguf.TokenType.BYTE:
        return bytes([int(text[3:-1], 16)])  # "<0xAB>"
    if kind in (gguf.TokenType.CONTROL, gguf.TokenType.UNKNOWN):
        return b""
    return text.replace(_SP, " ").encode("utf-8")


def _gpt2_bytes(text: str, kind: int) -> bytes:
    if kind == gguf.TokenType.CONTROL:
        return b""
    table = _gpt2_byte_of_char()
    if all(ch in table for ch in text):
        return bytes(table[ch] for ch in text)
    return text.encode("utf-8")  # user-defined tokens are stored as plain text


def _field(reader: Any, key: str, path: Path) -> Any:
    field = reader.get_field(key)
    if field is None:
        raise FixtureError(f"{path}: no {key} in the GGUF; the numerics suite needs the "
                           "model's own tokenizer to match probabilities to tokens")
    return field


def read_token_bytes(path: Path) -> tuple[bytes, ...]:
    """Every token's bytes, by id, for the model at ``path``."""
    reader = gguf.GGUFReader(path)
    model = _field(reader, "tokenizer.ggml.model", path).contents()
    texts = _field(reader, "tokenizer.ggml.tokens", path).contents()
    type_field = reader.get_field("tokenizer.ggml.token_type")
    kinds = (type_field.contents() if type_field is not None
             else [gguf.TokenType.NORMAL] * len(texts))
    if model == "llama":
        return tuple(_spm_bytes(t, k) for t, k in zip(texts, kinds, strict=True))
    if model == "gpt2":
        return tuple(_gpt2_bytes(t, k) for t, k in zip(texts, kinds, strict=True))
    raise FixtureError(f"{path}: tokenizer {model!r} is not one the numerics suite reads "
                       "(llama SentencePiece or gpt2 byte-level BPE)")
