"""The checkout the project's tests run from, and whether its Allure CLI is there.

The harness itself reads nothing through the checkout (its data are package resources);
the tests do, for the scripts, workflows and node_modules around the package.
"""

from __future__ import annotations

from pathlib import Path

from harness.errors import HarnessError

REPO_ROOT = Path(__file__).resolve().parent.parent


def allure_missing() -> str | None:
    """Why the harness would not find the Allure 3 CLI here (None: it would)."""
    from harness.report.allure_cli import allure_command  # noqa: PLC0415 - may not import

    try:
        allure_command()
    except HarnessError as exc:
        return str(exc)
    return None
