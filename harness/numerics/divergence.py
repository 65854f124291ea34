"""Per-position figures between two next-token distributions, as llama.cpp judges them.

``llama-perplexity --kl-divergence`` holds a build's distributions to a stored base's:
KL(base ‖ build), whether both put the same token on top, and the largest change in
one token's probability. The base here is the independent reference.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

LogProbs = npt.NDArray[np.float64]
#: The smallest "rest" of a partial row: float32's rounding of a sum of probabilities.
_REST_FLOOR = 1e-6


@dataclass(frozen=True)
class PositionFigures:
    """One generated position: ``position`` counts from the sequence's first token."""

    position: int
    kld: float
    server_top: int
    reference_top: int
    max_abs_dp: float

    @property
    def same_top(self) -> bool:
        return self.server_top == self.reference_top


@dataclass(frozen=True)
class Summary:
    """A probe's figures over its positions."""

    positions: int
    mean_kld: float
    max_kld: float
    top1_agreement: float
    max_abs_dp: float

    def as_dict(self) -> dict[str, float]:
        return {"positions": self.positions, "mean_kld": self.mean_kld,
                "max_kld": self.max_kld, "top1_agreement": self.top1_agreement,
                "max_abs_dp": self.max_abs_dp}


def _kl(p: npt.NDArray[np.float64], q: npt.NDArray[np.float64]) -> float:
    """KL(p ‖ q) in nats; an outcome q gives no probability that p does costs infinity."""
    with np.errstate(divide="ignore", invalid="ignore"):
        terms = np.where(p > 0, p * (np.log(p) - np.log(q)), 0.0)
    return float(max(terms.sum(), 0.0))


def row_kld(server: npt.NDArray[np.float64], reference: npt.NDArray[np.float64]) -> float:
    """KL(reference ‖ server) over one row (-inf: not listed). Where either side listed
    only its top tokens (``n_probs`` under the vocabulary: the real model's 49,152), the
    tokens not listed on both sides are one outcome, "the rest" — llama-perplexity's
    figure over a coarser partition, never more than the full one."""
    listed = np.isfinite(server) & np.isfinite(reference)
    p_ref, p_server = np.exp(reference[listed]), np.exp(server[listed])
    if listed.all():
        return _kl(p_ref, p_server)
    # The server's log-probabilities are float32: its listed tokens can sum to 1 within
    # rounding while the reference leaves the rest a sliver, so neither rest goes below
    # the rounding of a float32 sum.
    rest_ref = max(1.0 - float(p_ref.sum()), _REST_FLOOR)
    rest_server = max(1.0 - float(p_server.sum()), _REST_FLOOR)
    return _kl(np.append(p_ref, rest_ref), np.append(p_server, rest_server))


def position_figures(positions: Sequence[int], server: LogProbs,
                     reference: LogProbs) -> list[PositionFigures]:
    """Figures per row of ``server`` and ``reference`` (log-probabilities over the whole
    vocabulary, one row per entry of ``positions``; -inf in ``server``: not listed)."""
    if server.shape != reference.shape or server.shape[0] != len(positions):
        raise ValueError(f"server {server.shape} and reference {reference.shape} rows must "
                         f"match the {len(positions)} positions")
    kld = [row_kld(s, r) for s, r in zip(server, reference, strict=True)]
    # Over the listed tokens only: an unlisted one has no server probability to compare.
    listed = np.isfinite(server)
    dp = np.where(listed, np.abs(np.exp(server) - np.exp(reference)), 0.0).max(axis=1)
    server_top, reference_top = server.argmax(axis=1), reference.argmax(axis=1)
    return [PositionFigures(int(pos), k, int(s), int(r), float(d))
            for pos, k, s, r, d in zip(positions, kld, server_top, reference_top, dp,
                                       strict=True)]


def summarize(figures: Sequence[PositionFigures]) -> Summary:
    if not figures:
        raise ValueError("no positions to summarize")
    klds = [f.kld for f in figures]
    return Summary(len(figures), float(np.mean(klds)), max(klds),
                   sum(f.same_top for f in figures) / len(figures),
                   max(f.max_abs_dp for f in figures))
