"""How long the first-token request's prompt must be for ``ttft_ms`` to be judged (pure).

``ttft_ms`` has an absolute floor (``Metric.min_change``, 5 ms: the grain of a process
start), and a change smaller than the floor is never counted. At the suites' 32-token
prompt the first token of a small model takes about 16 ms, so the floor is about 30 %
of it and a 10 % first-token regression cannot be seen at all. ``harness ab`` therefore
times the first token on a prompt long enough that the floor lies well inside the
rule's band: one unpaired start of the baseline (the probe) gives its first-token time
and prompt speed at the timed prompt, and the first-token prompt is the shortest
doubling of that prompt predicted to take ``MARGIN`` times ``floor / threshold``.
A model whose first token is already slow (a large model on a CPU) keeps the timed
prompt: the probe shows the floor is small there.
"""

from __future__ import annotations

import math

#: How far past ``floor / threshold`` the first token should take: 1.5 puts the floor at
#: two thirds of the band, leaving room for a prompt speed the probe overestimated.
MARGIN = 1.5
#: The longest first-token prompt: ``harness ab --n-prompt`` allows no more, and a
#: fixture's trained context is 2048 tokens or more.
LONGEST_PROMPT = 2048


def wanted_first_token_ms(floor_ms: float, threshold: float) -> float:
    """The first-token time at which the floor is ``1 / MARGIN`` of the band."""
    return MARGIN * floor_ms / threshold


def first_token_prompt(n_prompt: int, probe_ttft_ms: float | None,
                       probe_prompt_tps: float | None, *, floor_ms: float,
                       threshold: float, longest: int = LONGEST_PROMPT) -> int:
    """The first-token prompt length for a comparison whose timed prompt is ``n_prompt``.

    ``probe_ttft_ms`` and ``probe_prompt_tps``: the baseline's figures at ``n_prompt``
    (None where the probe could not take one: the timed prompt is kept, and the floor
    rule says "unknown" with its reason if the first token is too short to judge).
    """
    if n_prompt < 1 or threshold <= 0:
        raise ValueError(f"n_prompt {n_prompt} and threshold {threshold} must be above 0")
    wanted_ms = wanted_first_token_ms(floor_ms, threshold)
    if (probe_ttft_ms is None or probe_prompt_tps is None or probe_prompt_tps <= 0
            or not math.isfinite(probe_ttft_ms) or not math.isfinite(probe_prompt_tps)
            or probe_ttft_ms >= wanted_ms or n_prompt >= longest):
        return n_prompt
    ms_per_token = 1000.0 / probe_prompt_tps
    needed = n_prompt + (wanted_ms - probe_ttft_ms) / ms_per_token
    length = n_prompt
    while length < needed and length < longest:
        length *= 2
    return min(length, longest)
