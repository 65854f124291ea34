"""Run one recorded test again with pytest, and say whether it failed the same way.

The rerun is a pytest child process with the node id, the resolved build and the
planner's recorded GPU as options, Allure results into a fresh folder; the outcome is
read back from there, so it is the same kind of record as the one being reproduced.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.facts.gpu import GpuInfo
from harness.paths import SUITES_NODEID_PREFIX, suites_ini
from harness.repro.properties import format_gpu_spec
from harness.repro.recorded_failure import NODEID_LABEL, RecordedFailure, first_line, labels

#: Settings that would change what the rerun tests: it passes its own options for them,
#: and one left in the environment must not fill in an option it leaves out.
OVERRIDDEN_ENV = ("HARNESS_BUILD", "HARNESS_SERVER_BIN", "HARNESS_SOURCE", "HARNESS_RUN_RECORD",
                  "HARNESS_PLANNER_GPU", "HARNESS_EXTERNAL_SERVER", "HARNESS_RUNNER",
                  "HARNESS_IMAGE", "HARNESS_KNOWN_FLAKES")
_FAILING = ("failed", "broken")


@dataclass(frozen=True)
class Rerun:
    nodeid: str
    rootdir: Path
    build_json: Path
    alluredir: Path
    planner_gpu: GpuInfo | None = None
    external: str | None = None
    #: Container runs: the image to start (by id, so it is exactly the recorded one).
    image: str | None = None

    def argv(self, python: str) -> list[str]:
        argv = [python, "-m", "pytest", self.nodeid, f"--rootdir={self.rootdir}",
                f"--alluredir={self.alluredir}", f"--harness-build={self.build_json}",
                # A known flake is turned into an xfail in CI; here its failure is the point.
                "--harness-known-flakes=none", "-p", "no:cacheprovider"]
        if self.nodeid.startswith(SUITES_NODEID_PREFIX):
            # The suites' own settings, as `harness run` ran them (harness/paths.py).
            argv += ["-c", str(suites_ini())]
        if self.planner_gpu is not None:
            argv.append(f"--harness-planner-gpu={format_gpu_spec(self.planner_gpu)}")
        if self.external is not None:
            argv.append(f"--harness-external-server={self.external}")
        if self.image is not None:
            argv += ["--harness-runner=container", f"--harness-image={self.image}"]
        return argv


#: What a calling pytest tells its children about itself (xdist's worker count sets the
#: servers' threads): ``harness repro`` started from a test must not pass it on.
_CALLER_PREFIXES = ("PYTEST_XDIST_", "PYTEST_CURRENT_TEST")


def rerun_env(environ: Mapping[str, str]) -> dict[str, str]:
    return {k: v for k, v in environ.items()
            if k not in OVERRIDDEN_ENV and not k.startswith(_CALLER_PREFIXES)}


def run_streaming(argv: list[str], cwd: Path, env: Mapping[str, str],
                  echo: Callable[[str], None]) -> int:
    """Run ``argv``, handing each output line to ``echo`` as it comes; its exit status."""
    with subprocess.Popen(argv, cwd=cwd, env=dict(env), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                          errors="replace") as process:
        assert process.stdout is not None
        for line in process.stdout:
            echo(line.rstrip("\n"))
        return process.wait()


@dataclass(frozen=True)
class Outcome:
    status: str
    message: str


def read_outcome(alluredir: Path, nodeid: str) -> Outcome | None:
    """The rerun's result for ``nodeid`` (its newest), or None when pytest wrote none."""
    newest: tuple[int, Outcome] | None = None
    for path in alluredir.glob("*-result.json"):
        try:
            result = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(result, dict) or nodeid not in labels(result, NODEID_LABEL):
            continue
        details = result.get("statusDetails") or {}
        outcome = Outcome(str(result.get("status", "")), str(details.get("message") or ""))
        stop = int(result.get("stop") or 0)
        if newest is None or stop >= newest[0]:
            newest = (stop, outcome)
    return None if newest is None else newest[1]


def verdict(recorded: RecordedFailure, outcome: Outcome | None) -> tuple[bool, str]:
    """(reproduced, what happened in words)."""
    if outcome is None:
        return False, ("no result: pytest collected nothing for the node id (renamed or "
                       "removed test?) or stopped before running it; its output is above")
    now = first_line(outcome.message)
    if outcome.status in _FAILING and recorded.status in _FAILING:
        if now == recorded.headline:
            return True, f"reproduced: {outcome.status} again, the same way: {now}"
        return True, (f"reproduced a failure, but a different one: recorded "
                      f"{recorded.status} '{recorded.headline}', now {outcome.status} '{now}'")
    if outcome.status == recorded.status:
        return True, f"reproduced: {outcome.status} again" + (f": {now}" if now else "")
    return False, (f"did not reproduce: recorded {recorded.status}"
                   + (f" '{recorded.headline}'" if recorded.headline else "")
                   + f", now {outcome.status}" + (f" '{now}'" if now else "")
                   + "; a flaky test, or one that depends on what ran before it")


def rootdir_for(recorded: str | None, fallback: Path) -> Path:
    """The run's rootdir when it exists here (same checkout), else ``fallback``."""
    if recorded and Path(recorded).is_dir():
        return Path(recorded)
    return fallback

