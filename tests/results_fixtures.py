"""Shared helpers for tests of run records, the results store and comparisons.

tests/ has no conftest.py and is not a package; pytest puts the directory on
sys.path, so a test module imports the helpers and binds the fixtures it uses (a bound
name rather than an import, so linters do not take test arguments for redefinitions)::

    import results_fixtures
    from results_fixtures import make_run, fig

    store_url = results_fixtures.store_url

``store_url`` runs a test once against a SQLite file and once against a throwaway
PostgreSQL database made on the server ``$HARNESS_TEST_POSTGRES_URL`` names.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from harness.plugin.required import skip_unless_present
from harness.results.run_record import (
    BuildRef,
    Figure,
    FigureKey,
    Hardware,
    Outcome,
    RunRecord,
    TestOutcome,
)
from harness.results.store import ResultsStore, open_store

POSTGRES_ENV = "HARNESS_TEST_POSTGRES_URL"

CPU_BOX = Hardware(host="ci-1", cpu="AMD EPYC 7763 64-Core Processor")
GPU_BOX = Hardware(host="gpu-1", cpu="Intel Xeon Gold 6338", gpu="NVIDIA H100 80GB HBM3",
                   gpu_driver="550.54.15", vram_mib=81559)

BUILD = BuildRef(backend="cpu", version="version: 5000 (abcdef12)", source_digest="0" * 64,
                 build_key="cpu-0123456789ab")

KEY = FigureKey(fixture="tiny-llama", backend="cpu", gpu="none", n_gpu_layers="0",
                cache_type_k="f16", cache_type_v="f16", flash_attn="off", offload="",
                n_prompt=128, n_gen=32)


def at(minute: int) -> str:
    """An ISO timestamp ``minute`` minutes into a fixed day (later minute = newer run)."""
    hours, minutes = divmod(minute, 60)
    return f"2025-01-01T{hours:02d}:{minutes:02d}:00+00:00"


def figure_key(**changes: Any) -> FigureKey:
    """:data:`KEY` with some fields changed."""
    return replace(KEY, **changes)


def fig(metric: str, value: float, *, test_id: str = "suites/test_bench.py::test_speed",
        key: FigureKey = KEY) -> Figure:
    """One figure, by default for the tiny CPU key."""
    return Figure(test_id=test_id, key=key, metric=metric, value=value)


def outcome(test_id: str, result: str = "passed", *, duration_s: float = 0.5,
            message: str | None = None) -> TestOutcome:
    return TestOutcome(test_id=test_id, outcome=Outcome(result), duration_s=duration_s,
                       message=message)


def make_run(run_id: str, *, branch: str = "main", started_at: str | None = None,
             hardware: Hardware = CPU_BOX, build: BuildRef = BUILD,
             outcomes: Sequence[TestOutcome] = (), figures: Sequence[Figure] = (),
             commit: str | None = None, labels: dict[str, str] | None = None) -> RunRecord:
    """A run record with plausible defaults for everything a test does not care about."""
    started = started_at if started_at is not None else at(0)
    return RunRecord(
        run_id=run_id, branch=branch, commit=commit or f"commit-of-{run_id}",
        started_at=started, finished_at=started,
        hardware=hardware, build=build, harness_version="0.1.0",
        outcomes=tuple(outcomes), figures=tuple(figures),
        labels=dict(labels) if labels is not None else {},
    )


def _postgres_database(base_url: str) -> Iterator[str]:
    """A fresh database on the server at ``base_url``, dropped afterwards."""
    name = f"harness_test_{uuid.uuid4().hex}"
    # CREATE/DROP DATABASE cannot run inside a transaction, hence autocommit.
    with psycopg.connect(base_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(base_url).set(database=name).render_as_string(hide_password=False)
    finally:
        _drop_database(base_url, name)


#: How long a dropped test database may stay busy with an autovacuum worker.
_DROP_DEADLINE_S = 30.0


def _drop_database(base_url: str, name: str) -> None:
    deadline = time.monotonic() + _DROP_DEADLINE_S
    while True:
        try:
            with psycopg.connect(base_url, autocommit=True) as admin:
                # FORCE: a test that failed may have left connections open.
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            return
        except psycopg.errors.InsufficientPrivilege:
            # An autovacuum worker (a superuser's process) had just started on the new
            # database; FORCE may not end it for this role, but it ends on its own.
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(params=["sqlite", "postgresql"])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """URL of an empty results store, on each backend in turn."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'results.sqlite'}"
        return
    yield from _throwaway_postgres()


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """URL of an empty PostgreSQL results store (what replicas of the service share)."""
    yield from _throwaway_postgres()


def _throwaway_postgres() -> Iterator[str]:
    base = os.environ.get(POSTGRES_ENV)
    skip_unless_present("postgres", None if base else (
        f"{POSTGRES_ENV} is unset: set it to a PostgreSQL URL whose role may create "
        "databases, e.g. postgresql://USER:PASSWORD@127.0.0.1:5432/postgres (.ci/run starts "
        "Debian's PostgreSQL and sets it)"))
    assert base is not None
    yield from _postgres_database(base)


@pytest.fixture
def store(store_url: str) -> Iterator[ResultsStore]:
    """An open, empty results store on each backend in turn."""
    with open_store(store_url) as opened:
        yield opened
