"""A build's numbers against another build's: fingerprints and their verdict (pure).

A fingerprint is one greedy completion's tokens and, at each position the server
reported, its top-``n`` log-probabilities. Two starts of one build give the *band*: the
largest per-position KL divergence between them along their common tokens (0 on a CPU
build, which computes the same bits every time). The candidate's fingerprints against
the baseline's give the *change*. The verdict is ``changed`` when the change exceeds
``BAND_FACTOR`` times the band, and never less than ``KLD_FLOOR``: a tenth of the
numerics suite's limit for f32 weights with an f16 cache (1e-4), so a change that
re-orders float sums (another thread split) is not one, and an error the suite's own
limit would only just catch is. Positions are compared up to and including the first
where the greedy tokens part: that position's distribution still follows the same
prefix, and a tie that flips there moves it by almost nothing.
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from harness.errors import ServerApiError
from harness.numerics.divergence import row_kld
from harness.numerics.probabilities import ReportedDistributions, parse_distributions

#: The smallest per-position KL divergence (nats) that counts as changed numbers.
KLD_FLOOR = 1e-5
#: How far past the same-build band a change must go.
BAND_FACTOR = 10.0
#: Top log-probabilities kept a position: plenty for the KL divergence's mass.
TOP_N = 64
#: Top log-probabilities a run record keeps a position: a suite of about forty probes
#: stays near a megabyte of run.json, and a change that moves the top 16 tokens' mass
#: by 1e-5 nats still shows (the rest of the vocabulary is one outcome).
RECORD_TOP_N = 16
#: Decimals a recorded log-probability keeps: a rounding of 5e-7 moves a KL divergence
#: by far less than KLD_FLOOR.
RECORD_DECIMALS = 6


@dataclass(frozen=True)
class Fingerprint:
    """``tokens``: every generated id; ``rows``: for each, its top log-probabilities as
    ``((id, logprob), ...)`` by id, or None where the server reported no entry."""

    tokens: tuple[int, ...]
    rows: tuple[tuple[tuple[int, float], ...] | None, ...]

    def __post_init__(self) -> None:
        if len(self.rows) != len(self.tokens):
            raise ValueError(f"{len(self.rows)} rows for {len(self.tokens)} tokens")

    def as_json(self) -> dict[str, Any]:
        """``{"tokens": [...], "rows": [null | {"<id>": logprob, ...}]}``: a row is an
        object keyed by token id, so a schema can close it (run_schema.py)."""
        return {"tokens": list(self.tokens),
                "rows": [None if r is None else {str(t): lp for t, lp in r}
                         for r in self.rows]}


def fingerprint_of(body: Mapping[str, Any], n_vocab: int,
                   token_bytes: Sequence[bytes]) -> Fingerprint:
    """The fingerprint of a ``/completion`` answer asked with ``n_probs`` and
    ``return_tokens`` (parsed and checked by ``parse_distributions``)."""
    return fingerprint_of_reported(parse_distributions(dict(body), n_vocab, token_bytes))


def fingerprint_of_reported(reported: ReportedDistributions, top_n: int | None = None,
                            decimals: int | None = None) -> Fingerprint:
    """The fingerprint of distributions already parsed: every listed token of each row,
    or its ``top_n`` most probable, log-probabilities rounded to ``decimals`` if given."""
    rows: list[tuple[tuple[int, float], ...] | None] = [None] * len(reported.generated)
    for index, row in zip(reported.indexes, reported.log_probs, strict=True):
        listed = np.flatnonzero(np.isfinite(row))
        if top_n is not None and len(listed) > top_n:
            # Most probable first; ties by id, so two runs of one build keep one set.
            listed = listed[np.lexsort((listed, -row[listed]))[:top_n]]
        rows[index] = tuple((int(t), float(row[t]) if decimals is None
                             else round(float(row[t]), decimals)) for t in sorted(listed))
    return Fingerprint(reported.generated, tuple(rows))


def record_fingerprint_of(reported: ReportedDistributions) -> Fingerprint:
    """What a run record keeps of a probe (``RECORD_TOP_N``, ``RECORD_DECIMALS``)."""
    return fingerprint_of_reported(reported, RECORD_TOP_N, RECORD_DECIMALS)


def fingerprint_from_json(data: Any) -> Fingerprint:
    """A fingerprint as ``Fingerprint.as_json`` wrote it (a stored A/B sample, a run
    record's ``numerics``)."""
    try:
        return Fingerprint(tuple(int(t) for t in data["tokens"]), tuple(
            None if r is None else tuple(sorted((int(t), float(lp)) for t, lp in r.items()))
            for r in data["rows"]))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ServerApiError(f"not a numerics fingerprint: {exc}") from None


def _dense(row: tuple[tuple[int, float], ...], size: int) -> np.ndarray[Any, np.dtype[np.float64]]:
    dense = np.full(size, -np.inf)
    for token, logprob in row:
        dense[token] = logprob
    return dense


@dataclass(frozen=True)
class Divergence:
    """Between two fingerprints: the largest per-position KL divergence and where, and
    the first position whose greedy token differs (None: the same tokens)."""

    max_kld: float
    at: int | None
    first_difference: int | None


def divergence(base: Fingerprint, other: Fingerprint) -> Divergence:
    """KL(base ‖ other) at each position both reported, up to and including the first
    position whose token differs."""
    common = next((i for i, (a, b) in enumerate(zip(base.tokens, other.tokens, strict=False))
                   if a != b), None)
    last = common if common is not None else min(len(base.tokens), len(other.tokens)) - 1
    size = 1 + max((t for row in (*base.rows, *other.rows) if row for t, _ in row), default=0)
    worst, at = 0.0, None
    for i in range(last + 1):
        a, b = base.rows[i], other.rows[i]
        if a is None or b is None:
            continue
        kld = row_kld(_dense(b, size), _dense(a, size))
        if kld > worst or at is None:
            worst, at = kld, i
    return Divergence(worst, at, common)


class NumericsVerdict(enum.StrEnum):
    UNCHANGED = "unchanged"
    CHANGED = "changed"
    NOT_MEASURED = "not measured"


@dataclass(frozen=True)
class NumericsComparison:
    verdict: NumericsVerdict
    #: Baseline against candidate, and the same build against itself (both arms).
    change: Divergence | None
    band_kld: float
    limit: float
    reason: str

    def as_json(self) -> dict[str, Any]:
        change = self.change
        return {"verdict": self.verdict.value, "limit": self.limit, "band_kld": self.band_kld,
                "max_kld": change.max_kld if change else None,
                "at": change.at if change else None,
                "first_token_difference": change.first_difference if change else None,
                "reason": self.reason[:1024]}


def compare_fingerprints(baseline: Sequence[Fingerprint],
                         candidate: Sequence[Fingerprint]) -> NumericsComparison:
    """The verdict on the candidate's numbers (module docstring)."""
    if not baseline or not candidate:
        return NumericsComparison(NumericsVerdict.NOT_MEASURED, None, 0.0, KLD_FLOOR,
                                  "no fingerprint in one arm (servers that answered no "
                                  "probabilities)")
    band = max((divergence(a, b).max_kld for arm in (baseline, candidate)
                for a, b in itertools.combinations(arm, 2)), default=0.0)
    limit = max(KLD_FLOOR, BAND_FACTOR * band)
    change = max((divergence(baseline[0], c) for c in candidate), key=lambda d: d.max_kld)
    parted = ("" if change.first_difference is None else
              f"; the greedy tokens part at position {change.first_difference}")
    if change.max_kld > limit:
        return NumericsComparison(
            NumericsVerdict.CHANGED, change, band, limit,
            f"KL divergence {change.max_kld:.3g} at generated position {change.at} exceeds "
            f"{limit:.3g} (the same build against itself: {band:.3g}){parted}")
    return NumericsComparison(
        NumericsVerdict.UNCHANGED, change, band, limit,
        f"largest KL divergence {change.max_kld:.3g} within {limit:.3g}{parted}")
