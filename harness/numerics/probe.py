"""One numerics probe against a running server: its greedy distributions, then the
reference along its tokens. The I/O half of the numerics suite, shared by the suite
(``suites/test_numerics.py``) and the tests that hold other backends to the reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.client import ServerClient
from harness.numerics.divergence import PositionFigures, Summary, position_figures, summarize
from harness.numerics.probabilities import ReportedDistributions, parse_distributions
from harness.reference import ReferenceModel

#: Plain English; in the fixtures' byte-fallback vocabulary about one token a character,
#: so with the generated tokens the sequence passes 128 positions.
PROMPT = ("The old lighthouse keeper climbed the stairs each evening, counting the steps "
          "and listening to the sea.")
N_PREDICT = 48


@dataclass(frozen=True)
class ProbeResult:
    prompt: tuple[int, ...]
    reported: ReportedDistributions
    figures: tuple[PositionFigures, ...]
    summary: Summary


def greedy_distributions(client: ServerClient, n_vocab: int, token_bytes: Sequence[bytes], *,
                         prompt: str | list[int] = PROMPT, n_predict: int = N_PREDICT,
                         top_n: int | None = None) -> tuple[list[int], ReportedDistributions]:
    """The prompt's tokens (the server's own tokenizer) and the greedy completion's
    pre-sampling distributions: the whole vocabulary, or its top ``top_n``."""
    tokens = client.tokenize(prompt) if isinstance(prompt, str) else list(prompt)
    done = client.completion(tokens, n_predict=n_predict, n_probs=top_n or n_vocab,
                             return_tokens=True, ignore_eos=True)
    return tokens, parse_distributions(done.raw, n_vocab, token_bytes)


def against_reference(prompt: Sequence[int], reported: ReportedDistributions,
                      reference: ReferenceModel) -> ProbeResult:
    """The reference along the server's own tokens (teacher-forced): each reported
    position's figures."""
    sequence = [*prompt, *reported.generated]
    # Row i of the reference predicts sequence[i + 1]: generated token j is predicted
    # by row len(prompt) - 1 + j.
    rows = [len(prompt) - 1 + j for j in reported.indexes]
    expected = reference.log_probs(sequence[:-1])[rows]
    positions = [len(prompt) + j for j in reported.indexes]
    figures = position_figures(positions, reported.log_probs, expected)
    return ProbeResult(tuple(prompt), reported, tuple(figures), summarize(figures))
