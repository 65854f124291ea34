"""The harness as an installed package: a wheel, installed anywhere, works like a checkout.

The wheel is built from a copy of the tree (nothing is written into the checkout) and
installed into a fresh virtual environment from the local wheelhouse that
``scripts/wheelhouse.py`` prepares (``--no-index``: the test downloads nothing). From a
folder outside the checkout the installed ``harness`` then plans, checks the fixtures,
finds the pinned CPU build in the cache, runs the smoke suite and renders its report,
reading every data file from site-packages and writing every output into that folder.
"""

from __future__ import annotations

import configparser
import json
import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from importlib.resources import files
from pathlib import Path

import pytest
from checkout import REPO_ROOT, allure_missing

from harness.paths import cache_root
from harness.plugin.required import skip_unless_present
from harness.resources import CARD_FOLDERS, card_path

WHEELHOUSE_ENV = "HARNESS_TEST_WHEELHOUSE"
#: What a copy of the tree for building leaves behind: caches, installs and outputs.
_NOT_SOURCE = shutil.ignore_patterns(".git", ".venv", "node_modules", "build", "dist",
                                     "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
                                     "allure-results", "allure-report", "harness-run")


def _wheelhouse() -> Path:
    given = os.environ.get(WHEELHOUSE_ENV)
    missing = None
    if not given:
        missing = (f"{WHEELHOUSE_ENV} is not set: scripts/test.sh prepares the wheelhouse "
                   f"(scripts/wheelhouse.py) and sets it")
    elif not any(Path(given).glob("*.whl")):
        missing = f"{WHEELHOUSE_ENV}={given} holds no wheels; run scripts/wheelhouse.py"
    skip_unless_present("wheelhouse", missing)
    return Path(str(given))


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The harness's wheel, built without build isolation from a copy of the tree."""
    work = tmp_path_factory.mktemp("wheel")
    tree = work / "tree"
    shutil.copytree(REPO_ROOT, tree, ignore=_NOT_SOURCE, symlinks=True)
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--disable-pip-version-check",
         "--no-deps", "--no-build-isolation", "--no-index", "--wheel-dir", str(work / "dist"),
         str(tree)], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (built,) = (work / "dist").glob("harness-*.whl")
    return built


def _tracked(*paths: str) -> list[str]:
    return subprocess.run(["git", "ls-files", "--", *paths], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True).stdout.split()


def _in_wheel(tracked: str) -> str:
    """Where a tracked file lands in the wheel: the design card's folders as the packages
    pyproject.toml maps them to (harness/resources, CARD_FOLDERS), the rest as it is."""
    for folder, package in CARD_FOLDERS.items():
        if tracked.startswith(folder + "/"):
            return package.replace(".", "/") + tracked.removeprefix(folder)
    return tracked


def test_the_wheel_holds_every_file_tracked_under_the_package_and_the_card(
        wheel: Path) -> None:
    listed = _tracked("harness", *CARD_FOLDERS)
    assert "configs/gpu/h200.json" in listed, "git ls-files listed the card's folders"
    assert "suites/test_smoke.py" in listed
    with zipfile.ZipFile(wheel) as archive:
        shipped = set(archive.namelist())
    assert "harness/configs_gpu/h200.json" in shipped
    assert sorted(_in_wheel(path) for path in listed if _in_wheel(path) not in shipped) == []


def test_the_package_list_is_every_package_on_disk() -> None:
    """pyproject.toml lists the packages by hand (the card's folders are mapped, so
    setuptools cannot find them): a new package under harness/ must be added there."""
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        setuptools = tomllib.load(handle)["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(REPO_ROOT).parts)
               for p in (REPO_ROOT / "harness").rglob("__init__.py")}
    assert set(setuptools["packages"]) == on_disk | set(CARD_FOLDERS.values())
    assert setuptools["package-dir"] == {package: folder
                                         for folder, package in CARD_FOLDERS.items()}


def test_the_editable_install_maps_the_card_folders_to_the_checkout() -> None:
    """In the checkout's own environment importlib.resources finds the top-level folders
    through the same package names the wheel has (not through the checkout fallback)."""
    for folder, package in CARD_FOLDERS.items():
        assert Path(str(files(package))) == REPO_ROOT / folder, package
        assert card_path(folder) == REPO_ROOT / folder


def test_the_suites_settings_equal_the_test_commands() -> None:
    """``harness run`` passes resources/suites.ini; the test command reads pyproject.toml."""
    parser = configparser.ConfigParser()
    parser.read(REPO_ROOT / "harness" / "resources" / "suites.ini")
    suites = dict(parser["pytest"])
    with (REPO_ROOT / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["tool"]["pytest"]["ini_options"]
    assert suites == {"addopts": project["addopts"], "timeout": str(project["timeout"]),
                      "filterwarnings": "\n".join(project["filterwarnings"])}


def _fresh_env(venv_dir: Path, tmp: Path) -> dict[str, str]:
    """Only what a user's shell would have, plus where the shared build cache is: no
    pytest or xdist variables of this run, and no checkout on any path."""
    path = [str(venv_dir / "bin"), *(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                     if p and not p.startswith(str(REPO_ROOT)))]
    return {"PATH": os.pathsep.join(path), "HOME": os.environ.get("HOME", str(tmp)),
            "LANG": "C.UTF-8", "HARNESS_CACHE": str(cache_root()),
            # Wide enough that rich prints the pytest command on one line.
            "COLUMNS": "400",
            "HARNESS_RESULTS_URL": f"sqlite:///{tmp / 'results.sqlite'}",
            "HARNESS_ALLURE_HISTORY": str(tmp / "history.jsonl"),
            # The documented setting: the installed harness has no checkout to look in.
            "HARNESS_ALLURE": str(REPO_ROOT / "node_modules" / ".bin" / "allure")}


def _run(argv: list[str], cwd: Path, env: dict[str, str],
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (f"{done.args} exited {done.returncode}:\n"
                                  f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done.stdout + done.stderr


def test_the_installed_wheel_runs_the_main_job_outside_the_checkout(
        wheel: Path, tmp_path: Path) -> None:
    wheelhouse = _wheelhouse()
    skip_unless_present("allure", allure_missing())
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    python = env_dir / "bin" / "python"
    env = _fresh_env(env_dir, tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    _ok(_run([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
              "--no-index", "--find-links", str(wheelhouse), "-c",
              str(REPO_ROOT / "harness" / "resources" / "constraints.txt"), str(wheel)],
             work, env, timeout=600))
    where = _ok(_run([str(python), "-c", "import harness; print(harness.__file__)"], work, env))
    assert Path(where.strip()).is_relative_to(env_dir), where
    harness = str(env_dir / "bin" / "harness")

    assert "cache hit" in _ok(_run([harness, "build", "--backend", "cpu"], work, env))
    _ok(_run([harness, "fixtures", "--check"], work, env))
    listed = _ok(_run([harness, "fixtures"], work, env))
    dense = next(line.split()[1] for line in listed.splitlines()
                 if line.split()[:1] == ["dense"])
    planned = _run([harness, "plan", "--model", dense, "--json"], work, env)
    _ok(planned)
    plan = json.loads(planned.stdout)
    assert plan["argv"][0].endswith("llama-server"), plan
    assert dense in plan["argv"], plan
    assert plan["kv"]["valid"], plan["kv"]

    done = _run([harness, "run", "--workers", "1", "-k", "smoke"], work, env, timeout=900)
    out = _ok(done)
    suites = str(env_dir / "lib")
    assert f"running pytest {suites}" in " ".join(out.split()), out[-2000:]
    record = json.loads((work / "harness-run" / "run.json").read_text())
    outcomes = record["outcomes"]
    assert outcomes, "the smoke suite ran tests"
    assert all(o["test_id"].startswith("suites/test_smoke.py::") for o in outcomes)
    assert {o["outcome"] for o in outcomes} == {"passed"}, outcomes
    assert any((work / "allure-results").glob("*-result.json"))
    assert (work / "allure-report" / "index.html").is_file()

    report = _ok(_run([harness, "report", "--output", "again"], work, env))
    assert (work / "again" / "index.html").is_file(), report
