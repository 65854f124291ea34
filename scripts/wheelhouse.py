"""Prepare the local wheelhouse that the wheel test installs the harness from.

tests/test_packaging.py builds the harness's wheel and installs it into a fresh virtual
environment with ``pip install --no-index``, so the test itself downloads nothing. The
wheels it needs besides the harness's own — every runtime dependency in pyproject.toml,
at the versions harness/resources/constraints.txt pins, with what they require — are
fetched here, once per set of pins, into ``$HARNESS_CACHE/wheelhouse/<digest>``. The
folder's path is the one line printed (scripts/test.sh exports it as
``HARNESS_TEST_WHEELHOUSE``).

    .venv/bin/python scripts/wheelhouse.py
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from harness.paths import cache_root

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / "harness" / "resources" / "constraints.txt"
#: Marks a complete wheelhouse: a download that stopped halfway is fetched again.
COMPLETE = ".complete"


def runtime_requirements() -> list[str]:
    with (ROOT / "pyproject.toml").open("rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


def wheelhouse_dir(requirements: list[str]) -> Path:
    digest = hashlib.sha256("\n".join([*requirements, CONSTRAINTS.read_text()]).encode())
    return cache_root() / "wheelhouse" / digest.hexdigest()[:16]


def main() -> int:
    requirements = runtime_requirements()
    target = wheelhouse_dir(requirements)
    if not (target / COMPLETE).is_file():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        done = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
             "--only-binary=:all:", "--dest", str(partial), "-c", str(CONSTRAINTS),
             *requirements], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"wheelhouse: pip could not fetch the runtime wheels into {partial} "
                  f"(exit {done.returncode}):\n{done.stderr[-3000:]}", file=sys.stderr)
            return 1
        (partial / COMPLETE).write_text("\n".join(requirements) + "\n")
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    print(target)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
