"""Where the harness keeps its caches, and where its suites sit for pytest.

Data files are found through harness/resources; outputs default to folders in the
working directory. Nothing here assumes a checkout: the same paths hold for an editable
checkout and for a wheel installed into site-packages.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from harness.resources import card_path, resource_path

#: The suites' folder: the design card's ``suites/`` in a checkout, the package
#: ``harness.suites`` (``site-packages/harness/suites/``) in a wheel.
SUITES_DIR = card_path("suites")
#: The folder holding it, which the suites run with as pytest's rootdir, so their node ids
#: read ``suites/test_<suite>.py::<test>`` wherever the harness is installed.
SUITES_ROOTDIR = SUITES_DIR.parent
SUITES_NODEID_PREFIX = "suites/"


def suites_ini() -> Path:
    """The suites' pytest settings (package data)."""
    return resource_path("suites.ini")


def cache_root(environ: Mapping[str, str] | None = None) -> Path:
    """``$HARNESS_CACHE`` or ``~/.cache/llama-harness``."""
    env = os.environ if environ is None else environ
    value = env.get("HARNESS_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "llama-harness"


def suites_pytest_config(cwd: Path | None = None) -> list[str]:
    """The pytest arguments that make every run of the suites alike: the rootdir above,
    the packaged ``suites.ini`` as the only config (no pytest.ini or pyproject.toml near
    the install or the working directory counts), and pytest's cache in the working
    directory rather than in site-packages."""
    here = Path.cwd() if cwd is None else cwd
    return [f"--rootdir={SUITES_ROOTDIR}", "-c", str(suites_ini()),
            "-o", f"cache_dir={here.absolute() / '.pytest_cache'}"]
