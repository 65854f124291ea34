"""Which generated tokens the server reports probabilities for.

llama-server (pinned ``tools/server/server-context.cpp``, ``process_token``) appends a
token, and with it its ``completion_probabilities`` entry, only when the text generated
so far does not end inside a multi-byte UTF-8 character (``validate_utf8`` in
``server-common.cpp``: a lead byte among the last 1 to 3 bytes that its sequence has not
yet filled). A model that emits raw bytes — every fixture's byte-fallback vocabulary —
has tokens whose entries are dropped; they are still generated and still in ``tokens``.
This module says which positions do have an entry, so each entry is matched with the
position it belongs to.
"""

from __future__ import annotations

from collections.abc import Sequence


def _cut_off(text: bytes) -> bool:
    """True when ``text`` ends inside a multi-byte character, by the server's own rule:
    looking back at most 4 bytes, a 2-, 3- or 4-byte lead with fewer bytes after it."""
    for back in range(1, min(4, len(text)) + 1):
        byte = text[-back]
        if (byte & 0xE0) == 0xC0 and back < 2:
            return True
        if (byte & 0xF0) == 0xE0 and back < 3:
            return True
        if (byte & 0xF8) == 0xF0 and back < 4:
            return True
    return False


def reported_positions(generated: Sequence[bytes]) -> list[int]:
    """Indexes into ``generated`` (each generated token's bytes, in order) of the tokens
    the server reports a probability entry for."""
    text = b""
    kept: list[int] = []
    for index, piece in enumerate(generated):
        text += piece
        if not _cut_off(text):
            kept.append(index)
    return kept
