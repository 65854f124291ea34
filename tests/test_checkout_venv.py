"""``scripts/checkout_venv.py`` on a copy of the checkout: its ``.venv`` imports the
copy's harness and takes the dependencies from the one shared environment this checkout
uses too, without installing them again."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from checkout import REPO_ROOT

SCRIPT = Path("scripts") / "checkout_venv.py"
LINK = Path("lib") / f"python{sys.version_info[0]}.{sys.version_info[1]}" / "site-packages" \
    / "harness-shared-deps.pth"


def _copy_checkout(to: Path) -> Path:
    to.mkdir()
    for name in ("pyproject.toml", "README.md", "scripts", "harness", "suites", "configs",
                 "fixtures", "ci"):
        source = REPO_ROOT / name
        if source.is_dir():
            shutil.copytree(source, to / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))
        elif source.exists():
            shutil.copy2(source, to / name)
    return to


def _setup(copy: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "HARNESS_SHARED_VENV"}
    return subprocess.run([os.path.realpath(sys.executable), str(copy / SCRIPT)], env=env,
                          capture_output=True, text=True, timeout=900, check=False)


def test_a_second_checkout_shares_the_dependencies_and_runs_its_own_code(
        tmp_path: Path) -> None:
    copy = _copy_checkout(tmp_path / "clone")
    done = _setup(copy)
    assert done.returncode == 0, done.stderr[-3000:]
    venv = copy / ".venv"
    ours = REPO_ROOT / ".venv" / LINK
    if ours.is_file():  # this checkout uses the shared environment: the copy gets the same
        assert (venv / LINK).read_text() == ours.read_text()
    python = venv / "bin" / "python"
    where = subprocess.run(
        [str(python), "-c", "import harness, pytest; print(harness.__file__); "
         "print(pytest.__file__)"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        check=True)
    harness_file, pytest_file = where.stdout.split()
    assert Path(harness_file).is_relative_to(copy)
    assert not Path(pytest_file).is_relative_to(copy)  # from the shared environment
    # A dependency's command runs with the copy's python, so it sees the copy's harness
    # (pytest lists the harness plugin it loads through the entry point).
    pytest_cmd = venv / "bin" / "pytest"
    assert pytest_cmd.read_text().splitlines()[0] == f"#!{python}"
    plugins = subprocess.run([str(pytest_cmd), "--version", "--version"], cwd=tmp_path,
                             capture_output=True, text=True, timeout=60, check=True)
    assert "harness-0.1.0" in plugins.stdout + plugins.stderr
    assert os.access(venv / "bin" / "harness", os.X_OK)
    # Again: nothing to do, nothing made afresh.
    stamp = venv / ".harness-deps"
    before = stamp.stat().st_mtime_ns
    again = _setup(copy)
    assert again.returncode == 0, again.stderr[-3000:]
    assert stamp.stat().st_mtime_ns == before
