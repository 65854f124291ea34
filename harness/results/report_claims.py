"""Report jobs claimed by service replicas: the statements (pure SQLAlchemy Core).

A run's report is a job while its ``reports`` row is pending. A replica claims one by
writing its name in ``claimed_by`` and a lease end in ``lease_ns``, renews the lease
while it works, and records the outcome only while the claim is still its own. A claim
whose lease ended (its replica died, or stalled past the lease) is free to take again.

What may be claimed keeps Allure's history right: reports of one branch and hardware
append to one history file, so they are made one at a time and in the order the runs
were stored. A pending job is claimable only when no older run of its branch and
hardware is pending (claimed or not), so at most one job per history file is ever
claimed, and the oldest goes first.

On PostgreSQL the candidate row is read ``FOR UPDATE SKIP LOCKED``: two replicas
claiming at once lock different rows, and the loser moves on to another job rather
than waiting. SQLite has no row locks; there the claim is one write (IMMEDIATE)
transaction, which SQLite already runs one at a time.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, Select, Update, and_, exists, or_, select, update
from sqlalchemy.orm import aliased

from harness.results.store_tables import reports, runs

_PENDING = "pending"


def claimable(now_ns: int) -> Select[tuple[str]]:
    """The next job to claim: the oldest queued pending report that nobody holds a live
    claim on and that no older pending run of its branch and hardware waits before."""
    older_run = aliased(runs)
    older_report = aliased(reports)
    older_pending = exists().where(
        older_report.c.run_id == older_run.c.run_id,
        older_report.c.state == _PENDING,
        older_run.c.branch == runs.c.branch,
        older_run.c.hardware_identity == runs.c.hardware_identity,
        older_run.c.seq < runs.c.seq)
    return (select(reports.c.run_id)
            .join(runs, runs.c.run_id == reports.c.run_id)
            .where(reports.c.state == _PENDING,
                   or_(reports.c.lease_ns.is_(None), reports.c.lease_ns < now_ns),
                   ~older_pending)
            .order_by(reports.c.queued_ns, runs.c.seq)
            .limit(1)
            .with_for_update(skip_locked=True, of=reports))


def take(run_id: str, replica: str, lease_until_ns: int) -> Update:
    """Claim ``run_id``'s job for ``replica`` until ``lease_until_ns``."""
    return (update(reports).where(reports.c.run_id == run_id, reports.c.state == _PENDING)
            .values(claimed_by=replica, lease_ns=lease_until_ns))


def _held_by(run_id: str, replica: str) -> ColumnElement[bool]:
    return and_(reports.c.run_id == run_id, reports.c.claimed_by == replica,
                reports.c.state == _PENDING)


def renew(run_id: str, replica: str, lease_until_ns: int) -> Update:
    """Extend ``replica``'s claim on ``run_id``; changes no row once the claim is lost."""
    return update(reports).where(_held_by(run_id, replica)).values(lease_ns=lease_until_ns)


def finish(run_id: str, replica: str, row: dict[str, object]) -> Update:
    """Record the job's outcome (``row``: a ``report_row``, which ends the claim) only
    while ``replica`` still holds it."""
    changes = {k: v for k, v in row.items() if k != "run_id"}
    return update(reports).where(_held_by(run_id, replica)).values(changes)


def release_all(replica: str) -> Update:
    """Give up every claim ``replica`` holds (a restarted replica's leftovers), so the
    jobs are taken at once instead of after their leases."""
    return (update(reports).where(and_(reports.c.claimed_by == replica,
                                       reports.c.state == _PENDING))
            .values(claimed_by=None, lease_ns=None))
