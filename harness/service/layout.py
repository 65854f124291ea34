"""Where the service keeps things under its data directory, and which names are safe there.

    data_dir/
      tmp/replicas/<replica>/       one replica's uploads, extractions and reports in
                                    progress (same filesystem, so finishing one is a
                                    rename); emptied when that replica starts, as is
                                    anything else in tmp/ (older services') and any
                                    leftover below
      runs/<run_id>/run.json        the uploaded record, as sent
      runs/<run_id>/allure-results/ the uploaded Allure results
      runs/<run_id>/report/         the generated Allure report (appears whole, by rename)
      history/<branch>/<hardware>.jsonl   Allure history, one trend per branch + hardware
      locks/ingest-<n>.lock         file locks that order uploads of one run id across
                                    every replica sharing the folder (a fixed set)

A run's report state (pending, ready, failed) is in the results store, committed with
the run. ``runs/<run_id>/report-state.json`` is where services before that kept it:
read once at start into the store, then removed. Partial report folders that older
services made beside ``report/`` (``.report.*``, ``..report.*``) are removed at start.

Several replicas of the service may share one data directory (and one PostgreSQL):
each works in its own ``tmp/replicas/<replica>/``, so a replica that starts sweeps its
own partial work and never another's.

Run ids come from the client, so they are checked against a closed character set
before they are ever joined to a path; replica names from the operator, against the
same set.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from harness.errors import ConfigError, HarnessError

#: Letters, digits, dot, dash, underscore; starts with a letter or digit, so neither
#: "." nor ".." nor a hidden name can be a run id.
_RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")
#: What a report being made (by this service or an older one) leaves beside ``report/``
#: when it is killed: ``.report.<hex>.partial``, Allure's ``..report.<hex>.partial.new-*``
#: and ``.report.new-*``/``.report.old-*``. Hidden, so never a run's uploaded file.
_REPORT_LEFTOVER = re.compile(r"\.\.?report\..*")


#: The replica name of a service started without one (tests, a single service).
DEFAULT_REPLICA = "solo"
#: A replica name: the run id's character set, at most 64 characters.
_REPLICA = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def check_replica(name: str) -> str:
    """``name`` if it may name a replica (and its folder), else ConfigError saying why."""
    if not _REPLICA.fullmatch(name):
        raise ConfigError(f"replica name {name!r} is not usable: give 1 to 64 letters, "
                          "digits, '.', '-' or '_', starting with a letter or digit "
                          "(harness serve --replica)")
    return name


class InvalidRunIdError(HarnessError):
    """A run id with characters the service will not put in a path."""


def is_valid_run_id(run_id: str) -> bool:
    return _RUN_ID.fullmatch(run_id) is not None


def check_run_id(run_id: str) -> str:
    if not is_valid_run_id(run_id):
        raise InvalidRunIdError(
            f"run id {run_id!r} is not allowed: use 1-128 letters, digits, '.', '-' or '_', "
            "starting with a letter or digit")
    return run_id


def safe_name(value: str) -> str:
    """A readable file name for any string; the hash keeps distinct values apart.

    "feature/x" and "feature-x" slug the same, so the digest of the exact value is part
    of the name: two branches never share a history file.
    """
    slug = _UNSAFE.sub("-", value).strip("-.")[:60] or "x"
    return f"{slug}-{hashlib.sha256(value.encode()).hexdigest()[:12]}"


@dataclass(frozen=True)
class Layout:
    data_dir: Path
    #: The replica whose own folders these are.
    replica: str = DEFAULT_REPLICA

    def __post_init__(self) -> None:
        check_replica(self.replica)

    @property
    def tmp_root(self) -> Path:
        return self.data_dir / "tmp"

    @property
    def tmp_dir(self) -> Path:
        """This replica's work in progress."""
        return self.tmp_root / "replicas" / self.replica

    def tmp_leftovers(self) -> list[Path]:
        """What this replica's start removes from tmp/: its own folder's contents, and
        whatever older services (before replicas) left directly in tmp/."""
        own = sorted(self.tmp_dir.iterdir()) if self.tmp_dir.is_dir() else []
        legacy = sorted(path for path in self.tmp_root.iterdir() if path.name != "replicas") \
            if self.tmp_root.is_dir() else []
        return [*own, *legacy]

    @property
    def runs_dir(self) -> Path:
        return self.data_dir / "runs"

    def ingest_lock(self, stripe: int) -> Path:
        """The file lock uploads of the run ids in ``stripe`` take, in every replica."""
        return self.data_dir / "locks" / f"ingest-{stripe}.lock"

    def run_dir(self, run_id: str) -> Path:
        return self.runs_dir / check_run_id(run_id)

    def results_dir(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "allure-results"

    def report_dir(self, run_id: str) -> Path:
        return self.run_dir(run_id) / "report"

    def legacy_report_state_file(self, run_id: str) -> Path:
        """Where services before the store kept the report state (imported at start)."""
        return self.run_dir(run_id) / "report-state.json"

    def report_leftovers(self) -> list[Path]:
        """Partial report folders under ``runs/*/`` that a killed report left behind."""
        if not self.runs_dir.is_dir():
            return []
        return sorted(path for path in self.runs_dir.glob("*/.*")
                      if _REPORT_LEFTOVER.fullmatch(path.name))

    def history_file(self, branch: str, hardware_identity: str) -> Path:
        branch_dir = self.data_dir / "history" / safe_name(branch)
        return branch_dir / f"{safe_name(hardware_identity)}.jsonl"

    def create(self) -> None:
        for path in (self.tmp_dir, self.runs_dir, self.data_dir / "history"):
            path.mkdir(parents=True, exist_ok=True)
