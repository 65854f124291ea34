"""Finding the Allure 3 CLI the report is rendered with, and refusing another release.

The CLI is ``$HARNESS_ALLURE`` when set (its path), else ``node_modules/.bin/allure`` in
the working directory or a folder above it (a checkout after ``scripts/setup.sh``, or any
folder after ``npm install allure@VERSION``), else ``allure`` on ``PATH``; a CLI of
another version than :data:`ALLURE_VERSION` is refused, with the install command.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from harness.errors import ToolMissingError

#: The Allure 3 release the report's config and categories are written for; package.json
#: and package-lock.json pin the same one (tests/test_report.py keeps them equal).
ALLURE_VERSION = "3.18.0"
#: The setting that names the CLI to run (a path), ahead of any other place.
ALLURE_ENV = "HARNESS_ALLURE"
#: The command that installs the pinned CLI in a checkout, from package-lock.json.
NPM_INSTALL = "npm ci --no-audit --no-fund"


def allure_command(environ: Mapping[str, str] | None = None,
                   cwd: Path | None = None) -> list[str]:
    """The command that runs the Allure 3 CLI, found as the module docstring says.

    Refuses with the install command when node or the CLI is missing, and when the CLI
    found is not the pinned version (reports differ between Allure releases).
    """
    env = os.environ if environ is None else environ
    node = shutil.which("node", path=env.get("PATH"))
    if node is None:
        raise ToolMissingError(f"node is not installed, and the Allure report CLI runs on it; "
                               f"install Node.js 20 (Debian: `apt-get install nodejs npm`), "
                               f"then {_install_hint()}")
    cli = find_allure_cli(env, Path.cwd() if cwd is None else cwd)
    installed = installed_version(cli)
    if installed is not None and installed != ALLURE_VERSION:
        raise ToolMissingError(f"{cli} is allure {installed}, but the harness is made for "
                               f"allure {ALLURE_VERSION}; {_install_hint()}")
    return [node, str(cli.resolve())] if _runs_on_node(cli) else [str(cli)]


def find_allure_cli(environ: Mapping[str, str], cwd: Path) -> Path:
    """``$HARNESS_ALLURE``, else ``node_modules/.bin/allure`` in ``cwd`` or a folder
    above it (where ``npm install`` puts it), else ``allure`` on ``PATH``."""
    given = environ.get(ALLURE_ENV)
    if given:
        path = Path(given).expanduser()
        if not path.is_file():
            raise ToolMissingError(f"{ALLURE_ENV}={given}: no such file; point it at the "
                                   f"Allure 3 CLI (node_modules/.bin/allure) or unset it")
        return path
    for folder in (cwd, *cwd.parents):
        local = folder / "node_modules" / ".bin" / "allure"
        if local.exists():
            return local
    on_path = shutil.which("allure", path=environ.get("PATH"))
    if on_path is not None:
        return Path(on_path)
    raise ToolMissingError(f"the Allure report CLI is not installed (no {ALLURE_ENV}, no "
                           f"node_modules/.bin/allure in {cwd} or above it, no `allure` "
                           f"on PATH); {_install_hint()}")


def installed_version(cli: Path) -> str | None:
    """The version in the package.json of the ``allure`` package that ``cli`` belongs
    to (npm links ``.bin/allure`` into it); None when it cannot be told."""
    try:
        resolved = cli.resolve(strict=True)
    except OSError:
        return None
    for folder in resolved.parents:
        try:
            manifest = json.loads((folder / "package.json").read_text())
        except (OSError, ValueError):
            continue
        if isinstance(manifest, dict) and manifest.get("name") == "allure":
            version = manifest.get("version")
            return version if isinstance(version, str) else None
    return None


def _runs_on_node(cli: Path) -> bool:
    """npm's CLIs are JavaScript files (``#!/usr/bin/env node``): run them with the node
    found above, so a PATH without node in the child still works."""
    target = cli.resolve()
    try:
        with target.open("rb") as handle:
            first = handle.readline(200)
    except OSError:
        return False
    return target.suffix in {".js", ".mjs", ".cjs"} or b"node" in first


def _install_hint() -> str:
    return (f"install it with `npm install allure@{ALLURE_VERSION}` in the working "
            f"directory (a checkout: `bash scripts/setup.sh`, which runs `{NPM_INSTALL}`), "
            f"or set {ALLURE_ENV} to the CLI's path")
