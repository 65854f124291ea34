"""The fixtures' tokenizers: a 269-token SentencePiece vocab with byte fallback, and a
foreign one a target model must refuse as a speculative drafter.

Both are SentencePiece ("llama" in GGUF) so they load in llama.cpp without a
pre-tokenizer; they differ in size and in the text of the tokens from id 3 on, which is
what llama.cpp's draft/target compatibility check compares (``common/speculative.cpp``
checks vocab type, BOS/EOS, size within 128, and token text from id 5 on).
"""

from __future__ import annotations

from dataclasses import dataclass

import gguf

from harness.errors import FixtureError
from harness.modelgen.specs import VocabKind

#: SentencePiece's word-boundary marker (U+2581), the prefix of word-initial pieces.
_SP = "\u2581"

#: Special tokens first, at the ids llama.cpp's SPM defaults expect.
_SPECIALS = (
    ("<unk>", gguf.TokenType.UNKNOWN),
    ("<s>", gguf.TokenType.CONTROL),
    ("</s>", gguf.TokenType.CONTROL),
)
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

#: Ten word pieces after the 256 byte tokens: 3 + 256 + 10 = the 269 tokens of docs/design.md.
_PIECES = (
    _SP,
    f"{_SP}hello",
    f"{_SP}world",
    f"{_SP}the",
    f"{_SP}a",
    f"{_SP}is",
    "he",
    "ll",
    "o",
    ".",
)

#: The foreign vocab puts its own pieces *before* the byte tokens, so token texts differ
#: from id 3 on, and it is 40 tokens larger.
_FOREIGN_PIECES = tuple(f"{_SP}f{i:02d}" for i in range(50))


@dataclass(frozen=True)
class Vocab:
    """Parallel token lists in id order, as GGUF's tokenizer arrays want them."""

    tokens: tuple[str, ...]
    scores: tuple[float, ...]
    types: tuple[int, ...]
    unk_id: int = UNK_ID
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID

    def token_id(self, text: str) -> int:
        try:
            return self.tokens.index(text)
        except ValueError:
            raise FixtureError(f"token {text!r} is not in this vocab") from None


def _byte_tokens() -> list[tuple[str, float, int]]:
    # The "<0xNN>" spelling is what llama.cpp's SPM byte fallback looks up.
    return [(f"<0x{b:02X}>", 0.0, int(gguf.TokenType.BYTE)) for b in range(256)]


def _pieces(texts: tuple[str, ...]) -> list[tuple[str, float, int]]:
    # Descending scores: SentencePiece merges the highest-scoring piece first.
    return [(t, -float(i), int(gguf.TokenType.NORMAL)) for i, t in enumerate(texts)]


def build_vocab(kind: VocabKind) -> Vocab:
    rows = [(t, 0.0, int(ty)) for t, ty in _SPECIALS]
    if kind is VocabKind.SPM_BYTES:
        rows += _byte_tokens() + _pieces(_PIECES)
    else:
        rows += _pieces(_FOREIGN_PIECES) + _byte_tokens()
    return Vocab(
        tokens=tuple(r[0] for r in rows),
        scores=tuple(r[1] for r in rows),
        types=tuple(r[2] for r in rows),
    )


def add_vocab(writer: gguf.GGUFWriter, vocab: Vocab) -> None:
    """Write the tokenizer keys; every key name comes from gguf's writer helpers."""
    writer.add_tokenizer_model("llama")  # GGUF's name for a SentencePiece vocab
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_scores(list(vocab.scores))
    writer.add_token_types(list(vocab.types))
    writer.add_unk_token_id(vocab.unk_id)
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
