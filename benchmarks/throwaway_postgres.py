"""An empty PostgreSQL database for a benchmark, made on the server the store tests use
and dropped afterwards (``service_scale.py``, ``service_load.py``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from sqlalchemy.engine import make_url

POSTGRES_ENV = "HARNESS_TEST_POSTGRES_URL"


@contextmanager
def postgres_database(prefix: str, needed_by: str) -> Iterator[str]:
    """The URL of a new database ``<prefix>_<hex>`` on ``$HARNESS_TEST_POSTGRES_URL``'s
    server, dropped on the way out; SystemExit naming ``needed_by`` when it is unset."""
    server = os.environ.get(POSTGRES_ENV)
    if not server:
        raise SystemExit(f"{needed_by} needs {POSTGRES_ENV}: a PostgreSQL URL whose role may "
                         "create databases (.ci/run sets one up)")
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(server).set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
