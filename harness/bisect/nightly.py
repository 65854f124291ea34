"""The nightly's bisect: from a comparison that found a regression to the culprit,
attached to the run in the results service (``HARNESS_NIGHTLY_BISECT=1``).

    python3 -m harness.bisect.nightly --service URL --run RUN_ID --baseline BRANCH \\
        --source GIT_TREE [--out DIR] [-- BISECT_OPTIONS...]

It asks the service for the comparison of the run with its baseline, picks the oracle
(the tests newly failing, else the first regressed figure's metric on its fixture),
takes the two commits from the runs' ``source.commit`` labels (the newest baseline run
is good, this run bad) and runs ``harness bisect ... --attach RUN_ID``. Exit 0 when
there was nothing to bisect or the bisect ran (its own exit code otherwise), 2 when it
cannot start: a run that does not name its commit, a service that does not answer.
The choice of oracle and commits is :func:`plan_bisect`, pure.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from harness.errors import HarnessError
from harness.paths import SUITES_NODEID_PREFIX
from harness.plugin.recording.source_labels import COMMIT_LABEL
from harness.service.service_client import ServiceCall

TIMEOUT_S = 60.0
MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class BisectPlan:
    good: str
    bad: str
    #: The oracle's options for ``harness bisect``.
    oracle: tuple[str, ...]
    why: str


def plan_bisect(comparison: Mapping[str, Any], baseline_labels: Mapping[str, str],
                current_labels: Mapping[str, str]) -> BisectPlan | str:
    """What to bisect for this comparison, or why nothing is (pure)."""
    failing = [str(t["test_id"]) for t in comparison.get("tests", {}).get("newly_failing", [])
               if str(t.get("test_id", "")).startswith(SUITES_NODEID_PREFIX)]
    regressed = [f for f in comparison.get("figures", []) if f.get("status") == "regressed"]
    if failing:
        oracle: tuple[str, ...] = tuple(arg for test in failing for arg in ("--test", test))
        why = f"{len(failing)} test(s) newly failing"
    elif regressed:
        figure = regressed[0]
        oracle = ("--metric", str(figure["metric"]), "--fixture",
                  str(figure["key"]["fixture"]))
        why = f"{figure['metric']} regressed on {figure['key']['fixture']}"
    else:
        return "the comparison found no newly failing test and no regressed figure"
    good, bad = baseline_labels.get(COMMIT_LABEL), current_labels.get(COMMIT_LABEL)
    if not good or not bad:
        return (f"the runs do not name their build's commit ({COMMIT_LABEL}): build from a "
                "clean git checkout (HARNESS_SOURCE) so the run record names it")
    if good == bad:
        return f"the baseline and this run were built from the same commit {good[:12]}"
    return BisectPlan(good=good, bad=bad, oracle=oracle, why=why)


def _get(service: str, path: str, params: dict[str, str] | None = None) -> dict[str, Any]:
    call = ServiceCall(service.rstrip("/"), "GET", path, TIMEOUT_S, MAX_BYTES)
    return call.json_object(call.send(params=params or {}))


def _labels(service: str, run_id: str) -> dict[str, str]:
    run = _get(service, f"/api/runs/{quote(run_id, safe='')}").get("run")
    labels = run.get("labels") if isinstance(run, dict) else None
    return {str(k): str(v) for k, v in labels.items()} if isinstance(labels, dict) else {}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m harness.bisect.nightly",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--service", required=True)
    parser.add_argument("--run", required=True)
    parser.add_argument("--baseline", required=True)
    parser.add_argument("--source", required=True, type=Path)
    parser.add_argument("--out", type=Path, default=Path("harness-bisect"))
    parser.add_argument("bisect_args", nargs="*")
    args = parser.parse_args(argv)
    try:
        comparison = _get(args.service, "/api/compare",
                          {"base": args.baseline, "head": args.run, "format": "json"})
        baseline_runs = comparison.get("baseline_runs") or []
        if not baseline_runs:
            raise HarnessError("the comparison names no baseline run")
        plan = plan_bisect(comparison, _labels(args.service, str(baseline_runs[0])),
                           _labels(args.service, args.run))
    except HarnessError as exc:
        print(f"nightly bisect: cannot start: {exc}", file=sys.stderr)
        return 2
    if isinstance(plan, str):
        print(f"nightly bisect: nothing to bisect: {plan}", file=sys.stderr)
        return 2 if "do not name" in plan else 0
    print(f"nightly bisect: {plan.why}; {plan.good[:12]}..{plan.bad[:12]}", file=sys.stderr)
    argv_bisect = [sys.executable, "-c", "from harness.commands import main; main()",
                   "bisect", "--source", str(args.source), "--good", plan.good,
                   "--bad", plan.bad, *plan.oracle, "--out", str(args.out),
                   "--attach", args.run, "--service", args.service, *args.bisect_args]
    return subprocess.run(argv_bisect, check=False, env=dict(os.environ)).returncode


if __name__ == "__main__":
    sys.exit(main())
