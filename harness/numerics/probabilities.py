"""The server's reported distributions, parsed and checked: one parser for that answer.

A ``/completion`` asked for ``n_probs`` = the vocabulary size and ``return_tokens``
answers with ``tokens`` (every generated id) and ``completion_probabilities`` (one entry
per reported token: its ``id`` and ``top_logprobs``, a list of ``{id, logprob}`` over the
whole vocabulary, pre-sampling by default). Anything else — a missing field, an id out
of range, a probability above 1, an entry that is not the token at its position — is a
``ServerApiError`` naming the field, never a traceback.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from harness.errors import ServerApiError
from harness.numerics.reported import reported_positions


@dataclass(frozen=True)
class ReportedDistributions:
    """``generated``: every generated id; ``indexes``: which of them have a row in
    ``log_probs`` (shape: rows x vocabulary, -inf where the server listed no value)."""

    generated: tuple[int, ...]
    indexes: tuple[int, ...]
    log_probs: npt.NDArray[np.float64]


def _int(value: Any, where: str, n_vocab: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < n_vocab:
        raise ServerApiError(f"{where}: {value!r} is not a token id in [0, {n_vocab})")
    return value


def _logprob(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ServerApiError(f"{where}: {value!r} is not a number")
    number = float(value)
    if math.isnan(number) or number > 1e-6:
        raise ServerApiError(f"{where}: {number!r} is not a log-probability (<= 0)")
    return min(number, 0.0)


def parse_distributions(body: dict[str, Any], n_vocab: int,
                        token_bytes: Sequence[bytes]) -> ReportedDistributions:
    """The distributions in a completion ``body``, each matched with its position by the
    server's own rule for which tokens it reports (``harness.numerics.reported``)."""
    raw_tokens = body.get("tokens")
    if not isinstance(raw_tokens, list) or not raw_tokens:
        raise ServerApiError("the completion has no generated `tokens`; ask with "
                             "return_tokens and n_predict > 0")
    generated = tuple(_int(t, f"tokens[{i}]", n_vocab) for i, t in enumerate(raw_tokens))
    entries = body.get("completion_probabilities")
    if not isinstance(entries, list):
        raise ServerApiError("the completion has no `completion_probabilities`; ask with "
                             "n_probs")
    indexes = reported_positions([token_bytes[t] for t in generated])
    if len(entries) != len(indexes):
        raise ServerApiError(
            f"the server reported {len(entries)} probability entries for {len(generated)} "
            f"generated tokens, where its UTF-8 rule keeps {len(indexes)}")
    rows = _rows(entries, [generated[i] for i in indexes], indexes, n_vocab,
                 "completion_probabilities")
    return ReportedDistributions(generated, tuple(indexes), rows)


def parse_chat_distributions(body: dict[str, Any], n_vocab: int) -> ReportedDistributions:
    """The distributions in a ``/v1/chat/completions`` answer asked with ``logprobs`` and
    ``top_logprobs``: ``choices[0].logprobs.content``, one entry per generated token with
    its ``id``. The answer carries no other list of ids, so an entry the server dropped
    (a token ending inside a UTF-8 character) cannot be placed: every generated token
    (``usage.completion_tokens``) must have its entry."""
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices else None
    logprobs = choice.get("logprobs") if isinstance(choice, dict) else None
    entries = logprobs.get("content") if isinstance(logprobs, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ServerApiError("the chat answer has no choices[0].logprobs.content; ask with "
                             "logprobs and max_tokens > 0")
    usage = body.get("usage")
    count = usage.get("completion_tokens") if isinstance(usage, dict) else None
    if count != len(entries):
        raise ServerApiError(f"the chat answer lists {len(entries)} token entries for "
                             f"usage.completion_tokens {count!r}: a token without its entry "
                             "cannot be placed (a reply ending inside a UTF-8 character?)")
    generated = tuple(_int(e.get("id") if isinstance(e, dict) else None,
                           f"logprobs.content[{i}].id", n_vocab)
                      for i, e in enumerate(entries))
    indexes = tuple(range(len(generated)))
    return ReportedDistributions(generated, indexes, _rows(entries, generated, indexes,
                                                           n_vocab, "logprobs.content"))


def _rows(entries: Sequence[Any], ids: Sequence[int], indexes: Sequence[int], n_vocab: int,
          field: str) -> npt.NDArray[np.float64]:
    """One row per entry, -inf where it lists no value; each entry's ``id`` must be the
    token at its position."""
    rows = np.full((len(entries), n_vocab), -np.inf, dtype=np.float64)
    for row, (entry, token, index) in enumerate(zip(entries, ids, indexes, strict=True)):
        where = f"{field}[{row}]"
        if not isinstance(entry, dict):
            raise ServerApiError(f"{where}: not an object")
        if _int(entry.get("id"), f"{where}.id", n_vocab) != token:
            raise ServerApiError(f"{where}.id {entry.get('id')!r} is not the token "
                                 f"generated at position {index} ({token})")
        candidates = entry.get("top_logprobs")
        if not isinstance(candidates, list):
            raise ServerApiError(f"{where}.top_logprobs: not a list")
        for k, candidate in enumerate(candidates):
            if not isinstance(candidate, dict):
                raise ServerApiError(f"{where}.top_logprobs[{k}]: not an object")
            listed = _int(candidate.get("id"), f"{where}.top_logprobs[{k}].id", n_vocab)
            rows[row, listed] = _logprob(candidate.get("logprob"),
                                         f"{where}.top_logprobs[{k}].logprob")
    return rows
