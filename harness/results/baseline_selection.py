"""Choose the baseline runs a run is compared with, reading them from the store.

The one part of ``harness compare`` that does I/O: a selector (``latest``, a run id or
a branch name) names the anchor run, and the window adds the runs before it on the
anchor's branch and hardware. What is done with them is
:func:`harness.results.comparison.compare`'s.
"""

from __future__ import annotations

from harness.errors import ConfigError, HarnessError
from harness.results.comparison import HardwareMismatchError
from harness.results.rules import NOISE_WINDOW
from harness.results.run_record import RunRecord
from harness.results.store import ResultsStore


def _unknown_selector(store: ResultsStore, selector: str) -> HarnessError:
    branches = store.branches(limit=8)
    latest = [run.run_id for run in store.list_runs(limit=5)]
    if not latest:
        return HarnessError(f"baseline {selector!r}: the results store at "
                            f"{store.url_for_display} holds no runs yet; store a run of "
                            "the baseline build first")
    return HarnessError(
        f"baseline {selector!r} is neither `latest`, a stored run id nor a branch with "
        f"stored runs in {store.url_for_display}; branches: {', '.join(branches)}; "
        f"newest runs: {', '.join(latest)}")


def _older_than(store: ResultsStore, current: RunRecord, *, hardware: str,
                limit: int) -> list[RunRecord]:
    """Runs on ``hardware`` older than ``current`` (all of them when it is not stored)."""
    if store.get_run(current.run_id) is not None:
        return store.list_runs(hardware=hardware, before_run=current.run_id, limit=limit)
    found = store.list_runs(hardware=hardware, limit=limit + 1)
    return [run for run in found if run.run_id != current.run_id][:limit]


def _anchor(store: ResultsStore, selector: str, current: RunRecord) -> RunRecord:
    identity = current.hardware.identity
    if selector == "latest":
        found = _older_than(store, current, hardware=identity, limit=1)
        if not found:
            raise HarnessError(
                f"baseline `latest`: no run older than {current.run_id} on "
                f"{current.hardware.describe()} in {store.url_for_display}; store a "
                "baseline run on this hardware first, or name a run id")
        return found[0]
    by_id = store.get_run(selector)
    if by_id is not None:
        if by_id.run_id == current.run_id:
            raise HarnessError(f"baseline {selector!r} is the run being compared; pick "
                               "an earlier run, a branch or `latest`")
        if by_id.hardware.identity != identity:
            raise HardwareMismatchError(by_id.hardware, current.hardware, by_id.run_id,
                                        current.run_id)
        return by_id
    on_branch = [run for run in store.list_runs(branch=selector, hardware=identity, limit=2)
                 if run.run_id != current.run_id]
    if on_branch:
        return on_branch[0]
    # The branch exists but only elsewhere (or only as the current run itself).
    elsewhere = [run for run in store.list_runs(branch=selector, limit=2)
                 if run.run_id != current.run_id]
    if elsewhere:
        raise HardwareMismatchError(elsewhere[0].hardware, current.hardware,
                                    elsewhere[0].run_id, current.run_id)
    if store.latest_run(branch=selector) is not None:
        raise HarnessError(f"baseline branch {selector!r} has no run other than "
                           f"{current.run_id} itself; store a baseline run first")
    raise _unknown_selector(store, selector)


def select_baseline(store: ResultsStore, selector: str, current: RunRecord,
                    window: int = NOISE_WINDOW) -> list[RunRecord]:
    """The anchor run ``selector`` names, then up to ``window - 1`` runs before it.

    ``selector``: ``latest`` (the newest stored run older than ``current`` on its
    hardware, any branch), a run id, or a branch name (its newest run on ``current``'s
    hardware). The runs before the anchor come from the anchor's branch and hardware.
    """
    if window < 1:
        raise ConfigError(f"baseline window {window} must be at least 1")
    anchor = _anchor(store, selector, current)
    preceding = store.list_runs(branch=anchor.branch, hardware=anchor.hardware.identity,
                                before_run=anchor.run_id, limit=window)
    preceding = [run for run in preceding if run.run_id != current.run_id]
    return [anchor, *preceding[:window - 1]]
