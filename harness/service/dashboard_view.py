"""What one dashboard request shows (pure): the model of a branch page, its filter and pages.

A branch page's model is every series of one branch on one hardware over its newest
``limit`` runs. It is a function of those runs alone: a stored run never changes (the
same run id again is refused unchanged), so the ids of the runs in the window name the
model, and :func:`window_version` of them is what the service caches it under and what
every plot URL of the page carries.

A request then shows a part of it: the series a :class:`SeriesFilter` admits (one
fixture, one metric, changed only), one page of ``PAGE_SIZE`` at a time, so a run with
thousands of figure keys is never drawn whole in one request. The index of branches and
hardware is paged the same way (:func:`page_of`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from harness.results.run_record import RunRecord
from harness.service.dashboard import (
    BisectNote,
    DashboardSeries,
    TuneNote,
    bisect_notes,
    dashboard_series,
    tune_notes,
)

#: Series on one page: a screenful of plots the browser fetches in a second or two.
PAGE_SIZE = 50
#: Rows of the index on one page.
INDEX_PAGE_SIZE = 100

T = TypeVar("T")


def window_version(run_ids_newest_first: Sequence[str]) -> str:
    """16 hex digits naming the runs a page shows (and so everything drawn from them)."""
    digest = hashlib.sha256()
    for run_id in run_ids_newest_first:
        # NUL cannot be in a run id, so no two lists of ids give the same bytes.
        digest.update(run_id.encode("utf-8", "surrogatepass") + b"\0")
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class DashboardModel:
    """Every series of one branch on one hardware over the newest ``limit`` runs."""

    branch: str
    hardware: str
    limit: int
    #: :func:`window_version` of the runs shown.
    version: str
    #: The newest run's ``Hardware.describe()``; empty without runs.
    description: str
    runs: int
    series: tuple[DashboardSeries, ...]
    by_id: Mapping[str, DashboardSeries] = field(compare=False)
    fixtures: tuple[str, ...]
    metrics: tuple[str, ...]
    #: The shown runs that carry a bisect, newest first.
    bisects: tuple[BisectNote, ...] = ()
    #: The shown runs that carry a tune of their card, newest first.
    tunes: tuple[TuneNote, ...] = ()

    @property
    def weight(self) -> int:
        """Roughly what holding the model costs: its points and series."""
        return len(self.series) + sum(len(s.points) for s in self.series)


def build_model(branch: str, hardware: str, limit: int, version: str,
                runs_newest_first: Sequence[RunRecord]) -> DashboardModel:
    series = dashboard_series(list(reversed(runs_newest_first)))
    return DashboardModel(
        branch=branch, hardware=hardware, limit=limit, version=version,
        description=runs_newest_first[0].hardware.describe() if runs_newest_first else "",
        runs=len(runs_newest_first), series=series,
        by_id={s.ident: s for s in series},
        fixtures=tuple(sorted({s.key.fixture for s in series})),
        metrics=tuple(sorted({s.metric.name for s in series})),
        bisects=bisect_notes(runs_newest_first), tunes=tune_notes(runs_newest_first))


@dataclass(frozen=True)
class SeriesFilter:
    """Which series a page shows; None and False admit everything."""

    fixture: str | None = None
    metric: str | None = None
    changed_only: bool = False

    def admits(self, series: DashboardSeries) -> bool:
        return ((self.fixture is None or series.key.fixture == self.fixture)
                and (self.metric is None or series.metric.name == self.metric)
                and (not self.changed_only or series.changed))


@dataclass(frozen=True)
class Paged(Generic[T]):
    """One page of a longer list."""

    items: tuple[T, ...]
    #: Length of the whole list.
    total: int
    #: 1-based; may be past the last page, which then shows nothing.
    page: int
    #: Pages of the whole list, at least 1.
    pages: int
    size: int

    @property
    def first(self) -> int:
        """1-based number of the first item shown, 0 when none is."""
        return (self.page - 1) * self.size + 1 if self.items else 0

    @property
    def last(self) -> int:
        return self.first + len(self.items) - 1 if self.items else 0


def page_of(items: Sequence[T], page: int, size: int) -> Paged[T]:
    start = (page - 1) * size
    return Paged(items=tuple(items[start:start + size]), total=len(items), page=page,
                 pages=max(1, -(-len(items) // size)), size=size)


def select_page(model: DashboardModel, chosen: SeriesFilter, page: int,
                size: int = PAGE_SIZE) -> Paged[DashboardSeries]:
    """The series ``chosen`` admits, page ``page`` of them, in the model's order."""
    return page_of([s for s in model.series if chosen.admits(s)], page, size)
