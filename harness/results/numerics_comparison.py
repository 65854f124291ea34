"""A run's numerics fingerprints against its baseline's, probe by probe (pure).

Each numerics test keeps one fingerprint in its run record (``RunRecord.numerics``: the
greedy tokens and each position's top log-probabilities). A probe of the run now is held
to the same probe of the baseline runs that tested the anchor's build: the anchor's
fingerprint is the baseline, and those runs against each other give the band
(harness/numerics/fingerprint.py's rule: ``changed`` past ten times the band and at
least its KL floor). A probe missing on either side is reported, not judged: the suite's
own outcome already says whether it ran.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from harness.errors import ServerApiError
from harness.numerics.fingerprint import (
    KLD_FLOOR,
    Fingerprint,
    NumericsComparison,
    NumericsVerdict,
    compare_fingerprints,
    fingerprint_from_json,
)
from harness.results.run_record import RunRecord


@dataclass(frozen=True)
class ProbeNumerics:
    """One probe (a numerics test's id) and its verdict against the baseline."""

    test_id: str
    comparison: NumericsComparison

    @property
    def changed(self) -> bool:
        return self.comparison.verdict is NumericsVerdict.CHANGED


def _not_measured(test_id: str, reason: str) -> ProbeNumerics:
    return ProbeNumerics(test_id, NumericsComparison(NumericsVerdict.NOT_MEASURED, None, 0.0,
                                                     KLD_FLOOR, reason))


def _fingerprints(runs: Sequence[RunRecord], test_id: str) -> list[Fingerprint]:
    found = []
    for run in runs:
        body = (run.numerics or {}).get(test_id)
        if body is None:
            continue
        try:
            found.append(fingerprint_from_json(body))
        except ServerApiError:
            continue  # a record whose rows and tokens disagree says nothing of the build
    return found


def compare_numerics(baseline: Sequence[RunRecord], current: RunRecord
                     ) -> tuple[ProbeNumerics, ...]:
    """Every probe of ``current`` held to the baseline (anchor first), by test id."""
    if not baseline or not current.numerics:
        return ()
    anchor = baseline[0]
    same_build = [run for run in baseline if run.build.build_key == anchor.build.build_key]
    results = []
    for test_id in sorted(current.numerics):
        now = _fingerprints([current], test_id)
        before = _fingerprints(same_build, test_id)
        if not now:
            results.append(_not_measured(test_id, "the run's fingerprint is unreadable "
                                         "(its rows and tokens disagree)"))
        elif not before:
            results.append(_not_measured(test_id, f"no fingerprint of this probe in the "
                                         f"baseline runs of build {anchor.build.build_key}"))
        else:
            results.append(ProbeNumerics(test_id, compare_fingerprints(before, now)))
    return tuple(results)
