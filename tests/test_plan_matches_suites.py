"""``harness plan`` plans what the suites launch, for the pin and for an older release.

Both build their request through one function (harness/plan_request.py), from the build
under test with its release: b10502 gives glm4moe's MTP block K/V cells and has no MTP
path for it, so ``fused-mtp``'s plan differs from the pin's, and each entry point must
plan that release's launch. The suites' plan is read from the plan-forwarding test's
Allure attachment ("plan 1"), as a user reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from harness import modelgen
from harness.builds.native import build_server
from harness.builds.resolve import ensure_build
from harness.planning.build_plan import BuildRequest
from harness.releases.release_source import fetch_release, release_build_request

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[1]
HARNESS = str(Path(sys.executable).with_name("harness"))
OLDER = 10502
BUNDLE = "fused-mtp"
TEST = f"suites/test_plan_forwarding.py::test_bundle_plan_reaches_the_server[{BUNDLE}]"
#: What a plan decides; its argv differs only in the binary's path.
COMPARED = ("fields", "kv", "offload", "unsupported", "route")


def _cli_plan(binary: Path, bundle: Path) -> dict[str, Any]:
    done = subprocess.run([HARNESS, "plan", "--bundle", str(bundle), "--build", str(binary),
                           "--json"], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    plan: dict[str, Any] = json.loads(done.stdout)
    return plan


def _suite_plan(binary: Path, results: Path) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "-n", "0", "--harness-build", str(binary), "--alluredir",
                           str(results), TEST], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    output = done.stdout + done.stderr
    for path in results.glob("*-result.json"):
        body = json.loads(path.read_text(encoding="utf-8"))
        for attachment in body.get("attachments", []):
            if attachment["name"] == "plan 1":
                plan: dict[str, Any] = json.loads(
                    (results / attachment["source"]).read_text(encoding="utf-8"))
                return plan
    raise AssertionError(f"no plan attached by {TEST}:\n{output[-3000:]}")


@pytest.mark.timeout(2400)
def test_harness_plan_plans_what_the_suites_launch_on_each_release(
        harness_cache: Path, fixture_set: modelgen.FixtureSet, tmp_path: Path) -> None:
    tree = fetch_release(harness_cache, OLDER)
    builds = {"pin": ensure_build(harness_cache, BuildRequest()).binary,
              f"b{OLDER}": build_server(harness_cache, tree,
                                        release_build_request(tree.path)).binary}
    decided = {}
    for name, binary in builds.items():
        cli = _cli_plan(binary, fixture_set.bundle(BUNDLE))
        suite = _suite_plan(binary, tmp_path / name)
        for part in COMPARED:
            assert cli[part] == suite[part], f"{name}: {part} differs:\n{cli[part]}\n{suite[part]}"
        decided[name] = {part: cli[part] for part in COMPARED}
    # The release is planned, not the pin's rules on every binary.
    assert decided["pin"]["kv"] != decided[f"b{OLDER}"]["kv"]
