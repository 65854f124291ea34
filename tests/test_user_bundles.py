"""The user's own bundles (``--harness-bundles DIR``): read strictly, and run by the suites.

A bundle folder is made here from the fixtures' files, as a user would lay out their own
(copies under new names, far from the fixture cache); the suites parametrized over
bundles then run over it with the same assertions, ``harness plan --bundle`` plans it,
and a folder that is not one is a usage error naming the file and the key.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness import modelgen
from harness.errors import ConfigError
from harness.facts.catalog import RuntimeClass
from harness.paths import SUITES_DIR, suites_pytest_config
from harness.probes.bundle_folder import load_bundle_folder

pytest_plugins = ["pytester"]

#: user folder name -> the fixture bundle it is a copy of.
COPIES = {"my-dense": "fused-dense", "my-mtp": "fused-mtp"}
#: A copy of fused-dense whose manifest says ``"spec_type": "none"`` (no speculation).
PLAIN = "my-plain"
#: The suite tests parametrized over bundles.
OVER_BUNDLES = ("test_bundle_plan_reaches_the_server",
                "test_fused_bundle_routes_to_the_fused_llama_cpp_backend",
                "test_fused_bundle_serves_with_its_catalog_entry")


@pytest.fixture
def user_folder(tmp_path: Path, fixture_set: modelgen.FixtureSet) -> Path:
    root = tmp_path / "my-bundles"
    for name, fixture in COPIES.items():
        shutil.copytree(fixture_set.bundle(fixture), root / name)
    # A bundle without speculation written as llama-server's word for it: "none".
    plain = root / PLAIN
    shutil.copytree(fixture_set.bundle("fused-dense"), plain)
    manifest = plain / "manifest.json"
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "drafter": None,
                                    "spec_type": "none"}))
    (root / ".git").mkdir()  # not a bundle, and not a problem
    return root


def test_every_subfolder_is_a_user_bundle(user_folder: Path) -> None:
    bundles = load_bundle_folder(user_folder)
    assert list(bundles) == ["user:my-dense", "user:my-mtp", f"user:{PLAIN}"]
    # "none" is read once, as no speculation: the manifest's null.
    assert bundles[f"user:{PLAIN}"].entry.spec_type is None
    assert bundles["user:my-dense"].root == user_folder / "my-dense"
    assert bundles["user:my-dense"].entry.runtime_class is RuntimeClass.FUSED
    assert bundles["user:my-mtp"].drafter_path is None


def test_every_broken_bundle_is_named_with_its_file_and_key(user_folder: Path) -> None:
    manifest = user_folder / "my-dense" / "manifest.json"
    data = json.loads(manifest.read_text())
    manifest.write_text(json.dumps({**data, "context_length": "long"}))
    (user_folder / "notes").mkdir()
    (user_folder / "my-mtp" / "text" / "tiny-mtp.gguf").unlink()
    with pytest.raises(ConfigError) as caught:
        load_bundle_folder(user_folder)
    message = str(caught.value)
    assert "3 of its folders are not bundles" in message
    assert f"{manifest}: $.context_length: \"long\" is not allowed" in message
    assert f"{user_folder / 'notes'}: no manifest.json" in message
    assert "tiny-mtp.gguf is missing" in message
    assert message.endswith("fixtures/models/README.md describes the layout")
    assert message.count("describes the layout") == 1


def test_an_empty_or_missing_folder_says_what_a_bundle_folder_is(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds no bundle folder; each bundle is a folder"):
        load_bundle_folder(tmp_path)
    with pytest.raises(ConfigError, match="no such folder"):
        load_bundle_folder(tmp_path / "nothing")


def test_a_bad_bundle_folder_stops_the_session_before_any_test(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_BUNDLES", str(tmp_path / "empty"))
    (tmp_path / "empty").mkdir()
    pytester.makepyfile("def test_trivial():\n    assert True\n")
    result = pytester.runpytest_subprocess()
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    output = result.stdout.str() + result.stderr.str()
    assert "--harness-bundles:" in output
    assert "holds no bundle folder" in output
    assert "Traceback" not in output


def test_harness_plan_plans_a_user_bundle(user_folder: Path) -> None:
    done = subprocess.run([sys.executable, "-c", "from harness.commands import main; main()",
                           "plan", "--bundle", str(user_folder / "my-dense"), "--json"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["route"]["fused"] is True
    assert str(user_folder / "my-dense" / "text" / "tiny-dense.gguf") in plan["argv"]


@pytest.mark.server
def test_the_suites_run_over_the_user_bundles(user_folder: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", str(SUITES_DIR), *suites_pytest_config(tmp_path),
         "-p", "no:xdist", "-q", "-rA", "-k", "user:", f"--harness-bundles={user_folder}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    # The summary shows each test's path relative to the working directory.
    passed = {"suites/" + line.split()[1].split("suites/")[-1]
              for line in done.stdout.splitlines() if line.startswith("PASSED ")}
    expected = {f"suites/{module}::{test}[{bundle}]"
                for module, test in (("test_plan_forwarding.py", OVER_BUNDLES[0]),
                                     ("test_routing.py", OVER_BUNDLES[1]),
                                     ("test_smoke.py", OVER_BUNDLES[2]))
                for bundle in ("user:my-dense", "user:my-mtp", f"user:{PLAIN}")}
    assert passed == expected, output[-4000:]
