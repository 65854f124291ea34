"""A probe's figures against its threshold: the failure lines, or none."""

from __future__ import annotations

from collections.abc import Sequence

from harness.numerics.divergence import PositionFigures, Summary
from harness.numerics.thresholds import Threshold

#: Positions one probe may have over the KL limit. A quantized MoE model's router can
#: pick another expert at a near tie when activations are rounded: one position then
#: moves far (measured: moe-q4_1 on an H200's CUDA build, 0.43 at one of 35 positions,
#: the others under 0.01), on a correct build. A wrong kernel moves every position.
OUTLIERS_ALLOWED = 1


def _token(token_id: int, token_bytes: Sequence[bytes]) -> str:
    return f"{token_bytes[token_id]!r} (id {token_id})"


def judge(label: str, figures: Sequence[PositionFigures], summary: Summary,
          limit: Threshold, token_bytes: Sequence[bytes]) -> list[str]:
    """Each way ``figures`` break ``limit``, in words that name ``label`` (fixture,
    weight and KV types), the position, both top tokens, the figure and the limit."""
    failures: list[str] = []
    over = sorted((f for f in figures if f.kld > limit.max_kld), key=lambda f: -f.kld)
    if len(over) > OUTLIERS_ALLOWED:
        worst = over[0]
        failures.append(
            f"{label}: KL divergence from the reference {worst.kld:.3g} at position "
            f"{worst.position} exceeds {limit.max_kld:g} ({len(over)} of {len(figures)} "
            f"positions over, {OUTLIERS_ALLOWED} allowed; mean {summary.mean_kld:.3g}); "
            "top token there: server "
            f"{_token(worst.server_top, token_bytes)}, reference "
            f"{_token(worst.reference_top, token_bytes)}; limit: {limit.why}")
    if summary.top1_agreement < limit.min_top1:
        first = next(f for f in figures if not f.same_top)
        failures.append(
            f"{label}: top token agrees with the reference at {summary.top1_agreement:.0%} "
            f"of {len(figures)} positions, under {limit.min_top1:.0%}; first difference "
            f"at position {first.position}: server {_token(first.server_top, token_bytes)}, "
            f"reference {_token(first.reference_top, token_bytes)} (KLD {first.kld:.3g}); "
            f"limit: {limit.why}")
    return failures
