"""Listing queries that read the ``runs`` table alone (pure SQLAlchemy Core statements).

The dashboard asks two things that loading whole runs cannot answer cheaply: which runs
a branch page shows now (its cache key), and every branch and hardware pair with its
number of runs (the index). :class:`harness.results.store.ResultsStore` runs these on
its own engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import ColumnElement, Select, and_, func, or_, select

from harness.results.store_tables import runs


@dataclass(frozen=True)
class RunPair:
    """One branch on one hardware, as the index lists it."""

    branch: str
    hardware: str
    runs: int
    #: The newest ``started_at`` of its runs.
    latest: str
    #: The most recently stored run of the pair, whose hardware describes it.
    newest_seq: int


def newest_run_ids(branch: str, hardware: str, limit: int) -> Select[tuple[str]]:
    """Ids of the newest ``limit`` runs of ``branch`` on ``hardware``, in list_runs' order."""
    return (select(runs.c.run_id)
            .where(runs.c.branch == branch, runs.c.hardware_identity == hardware)
            .order_by(runs.c.started_at.desc(), runs.c.seq.desc()).limit(limit))


def pair_counts(branch: str | None, hardware: str | None) -> Select[tuple[str, str, int, str, int]]:
    """Each branch and hardware pair with runs (filtered when given): count, newest start
    and newest stored run."""
    query = (select(runs.c.branch, runs.c.hardware_identity,
                    func.count().label("runs"), func.max(runs.c.started_at).label("latest"),
                    func.max(runs.c.seq).label("newest_seq"))
             .group_by(runs.c.branch, runs.c.hardware_identity))
    if branch is not None:
        query = query.where(runs.c.branch == branch)
    if hardware is not None:
        query = query.where(runs.c.hardware_identity == hardware)
    return query


def hardware_columns(seqs: Sequence[int]) -> Select[tuple[int, str]]:
    """The ``hardware`` JSON text of the runs stored as ``seqs``."""
    return select(runs.c.seq, runs.c.hardware).where(runs.c.seq.in_(list(seqs)))


def filtered_runs(branch: str | None, hardware: str | None) -> Select[tuple[object, ...]]:
    """Every column of the runs of ``branch`` on ``hardware`` (None: any)."""
    query = select(runs)
    if branch is not None:
        query = query.where(runs.c.branch == branch)
    if hardware is not None:
        query = query.where(runs.c.hardware_identity == hardware)
    return query


def older_than(started_at: str, seq: int) -> ColumnElement[bool]:
    """Runs after the run (``started_at``, ``seq``) in list_runs' newest-first order."""
    return or_(runs.c.started_at < started_at,
               and_(runs.c.started_at == started_at, runs.c.seq < seq))
