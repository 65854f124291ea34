"""A stored run without its outcomes and figures: what a listing of runs shows (pure).

Listing whole run records reads every outcome and figure of every run on the page
(hundreds each for the main job); a summary is one ``runs`` row and its outcome counts,
which the store counts in the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from harness.results.run_record import BuildRef, Hardware


@dataclass(frozen=True)
class RunSummary:
    run_id: str
    branch: str
    commit: str
    started_at: str
    finished_at: str
    hardware: Hardware
    build: BuildRef
    #: How many of the run's tests ended each way, by outcome word (``passed``, …); an outcome
    #: no test had is left out.
    outcome_counts: Mapping[str, int] = field(default_factory=dict)
