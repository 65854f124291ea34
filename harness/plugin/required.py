"""``HARNESS_TEST_REQUIRE``: what a test run must have, so it cannot pass by skipping.

A test that needs Docker, PostgreSQL, Chromium, the Allure CLI, the wheelhouse or the
real model (``harness fixtures --real``) skips
with the reason where one is missing — right on a laptop, wrong in CI, where a broken install step
would otherwise turn a whole area of tests into skips and the run green. With
``HARNESS_TEST_REQUIRE=docker,postgres,chromium,allure,wheelhouse,real-model`` (any
subset; ``.ci/run`` sets all six) such a test fails instead, naming what is missing and the fix.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ENV = "HARNESS_TEST_REQUIRE"
#: What a test may need from the machine and skip without.
RESOURCES = ("docker", "postgres", "chromium", "allure", "wheelhouse", "real-model")


class RequireSettingError(ValueError):
    """HARNESS_TEST_REQUIRE names something that is not a resource."""


def required_resources(value: str | None = None) -> frozenset[str]:
    """The resources ``value`` (default: ``$HARNESS_TEST_REQUIRE``) names."""
    raw = os.environ.get(REQUIRE_ENV, "") if value is None else value
    names = frozenset(part.strip().lower() for part in raw.split(",") if part.strip())
    unknown = sorted(names - set(RESOURCES))
    if unknown:
        raise RequireSettingError(
            f"{REQUIRE_ENV}={raw!r} names {', '.join(unknown)}; allowed: "
            f"{', '.join(RESOURCES)} (comma-separated), or leave it unset")
    return names


def skip_unless_present(resource: str, missing: str | None) -> None:
    """Skip the test with ``missing`` as the reason, or fail it if ``resource`` is required.

    ``missing`` is None when the resource is there (then nothing happens).
    """
    if resource not in RESOURCES:
        raise ValueError(f"unknown resource {resource!r}; one of {', '.join(RESOURCES)}")
    if missing is None:
        return
    if resource in required_resources():
        pytest.fail(f"{REQUIRE_ENV} requires {resource}, but it is missing: {missing}",
                    pytrace=False)
    pytest.skip(missing)
