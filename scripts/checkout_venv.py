"""Makes the checkout's ``.venv``: a small virtual environment that holds only the
editable harness, on top of one environment of its pinned dependencies that every
checkout shares, kept in the harness cache under ``venvs/KEY``.

Why shared: the dependencies are 1.3 GB (the CUDA libraries of the dev extra are most of
it), and installing them took a fresh clone about 45 s of its test run. A path that stays
the same also keeps mypy's cache of the third-party modules valid from clone to clone
(it keys that cache by path: about 18 s more). KEY is a digest of the Python, the
requirements in pyproject.toml and harness/resources/constraints.txt, so a change of pins
makes a new shared environment, never an edit of one another checkout uses.

How the checkout sees it: a ``.pth`` file in ``.venv``'s site-packages adds the shared
site-packages after its own, and ``.venv/bin`` gets the shared environment's commands
(pytest, ruff, mypy…) with their first line pointing at ``.venv/bin/python``, so they
import this checkout's harness. ``HARNESS_SHARED_VENV=off`` installs everything into
``.venv`` instead, as a plain ``pip install -e '.[dev]'`` would.

Standard library only (and harness/paths.py, which is too): it runs with the system
python3, before any environment exists.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# harness.paths imports only the standard library, so the checkout's own copy can be read
# before any environment exists.
sys.path.insert(0, str(ROOT))
from harness.paths import cache_root  # noqa: E402

CONSTRAINTS = ROOT / "harness" / "resources" / "constraints.txt"
CHECKOUT_VENV = ROOT / ".venv"
#: The file in ``.venv``'s site-packages that adds the shared environment's.
LINK_PTH = "harness-shared-deps.pth"
STAMP = ".harness-deps"
#: Shared environments unused this long are removed when another is made.
STALE_S = 30 * 24 * 3600
PIP = ["-m", "pip", "install", "-q", "--disable-pip-version-check"]


def requirements() -> list[str]:
    """The harness's requirements with its dev extra, as pyproject.toml lists them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"]["dev"]]


def environment_key(reqs: list[str]) -> str:
    digest = hashlib.sha256()
    for part in (sys.version, sys.base_prefix, json.dumps(reqs),
                 CONSTRAINTS.read_text()):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:16]


def site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages"


def _run(*argv: str | Path) -> None:
    subprocess.run([str(a) for a in argv], check=True)


def ensure_shared(shared: Path, reqs: list[str]) -> None:
    """The shared environment at ``shared``, made once; a lock keeps two checkouts that
    set up at the same moment from making it twice."""
    complete = shared / ".complete"
    shared.parent.mkdir(parents=True, exist_ok=True)
    with open(shared.parent / f"{shared.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not complete.exists():
            # A half-made one (an install that failed or was killed) is made again.
            shutil.rmtree(shared, ignore_errors=True)
            venv.create(shared, with_pip=True, symlinks=True)
            _run(shared / "bin" / "python", *PIP, "-c", CONSTRAINTS, *reqs)
            complete.write_text(json.dumps(reqs) + "\n")
            _remove_stale(shared)
    os.utime(complete)  # marks it used, for _remove_stale


def _remove_stale(keep: Path) -> None:
    now = time.time()
    for other in keep.parent.iterdir():
        complete = other / ".complete"
        if other == keep or not complete.exists():
            continue
        if now - complete.stat().st_mtime > STALE_S:
            shutil.rmtree(other, ignore_errors=True)


def _link_commands(shared: Path, checkout: Path) -> None:
    """``checkout/bin`` gets each command of ``shared/bin`` it lacks: a script's first
    line is pointed at the checkout's python, a compiled command is linked."""
    shared_python = str(shared / "bin" / "python")
    bin_dir = checkout / "bin"
    for command in sorted((shared / "bin").iterdir()):
        target = bin_dir / command.name
        if command.name.startswith(("python", "activate", "Activate")) or target.exists():
            continue
        content = command.read_bytes()
        # A script names its python on its first line, or (pip's form for a long path)
        # in a /bin/sh line after it.
        head, body = content[:512], content[512:]
        if head.startswith(b"#!") and shared_python.encode() in head:
            head = head.replace(shared_python.encode(), str(bin_dir / "python").encode())
            target.write_bytes(head + body)
            target.chmod(0o755)
        else:
            target.symlink_to(command)


def make_checkout_venv(shared: Path, key: str) -> None:
    """``.venv`` made afresh: the link to ``shared``, its commands, the editable harness."""
    shutil.rmtree(CHECKOUT_VENV, ignore_errors=True)
    venv.create(CHECKOUT_VENV, with_pip=False, symlinks=True)
    (site_packages(CHECKOUT_VENV) / LINK_PTH).write_text(
        f"import site; site.addsitedir({str(site_packages(shared))!r})\n")
    _link_commands(shared, CHECKOUT_VENV)
    # pip and setuptools come from the shared environment through the link.
    _run(CHECKOUT_VENV / "bin" / "python", *PIP, "--no-deps", "--no-build-isolation",
         "-e", ROOT)
    (CHECKOUT_VENV / STAMP).write_text(key + "\n")


def main() -> None:
    reqs = requirements()
    key = environment_key(reqs)
    stamp = CHECKOUT_VENV / STAMP
    if os.environ.get("HARNESS_SHARED_VENV", "").lower() == "off":
        key += "-own"
        if stamp.is_file() and stamp.read_text().strip() == key:
            return
        if (site_packages(CHECKOUT_VENV) / LINK_PTH).exists():
            shutil.rmtree(CHECKOUT_VENV)
        if not (CHECKOUT_VENV / "bin" / "python").exists():
            venv.create(CHECKOUT_VENV, with_pip=True, symlinks=True)
        _run(CHECKOUT_VENV / "bin" / "python", *PIP, "-c", CONSTRAINTS, "-e", f"{ROOT}[dev]")
        stamp.write_text(key + "\n")
        return
    shared = cache_root() / "venvs" / key
    ensure_shared(shared, reqs)
    if stamp.is_file() and stamp.read_text().strip() == key \
            and (CHECKOUT_VENV / "bin" / "python").exists():
        return
    make_checkout_venv(shared, key)


if __name__ == "__main__":
    main()
