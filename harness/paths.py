"""Where the harness keeps its caches and finds the repository's data files."""

from __future__ import annotations

import os
from pathlib import Path

#: The repository root: data files (fixture specs, the source manifest, GPU configs)
#: are read from the checkout the harness is installed from (an editable install).
REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root(environ: os._Environ[str] | dict[str, str] | None = None) -> Path:
    """``$HARNESS_CACHE`` or ``~/.cache/llama-harness``."""
    env = os.environ if environ is None else environ
    value = env.get("HARNESS_CACHE")
    return Path(value).expanduser() if value else Path.home() / ".cache" / "llama-harness"
