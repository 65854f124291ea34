"""An A/B comparison as one Allure result: its verdicts, a per-sample table and a plot.

Written into the run's ``allure-results`` folder (``harness ab --allure-results``, the
gate's A/B step), so the run's report shows the comparison beside the suites' tests:
failed when a metric regressed or the numbers changed (``harness ab`` exits 1);
``unknown``, Allure's own status that is neither passed nor failed, when the comparison
is undecided (exit 3), so an undecided comparison never reads as a pass; passed
otherwise.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any

from harness.ab.decision import AbVerdict
from harness.ab.plot import paired_samples_png
from harness.ab.report import table, undecided
from harness.ab.runner import AbOutcome
from harness.ab.undecided import undecided_lines
from harness.files import write_json_atomic
from harness.numerics.fingerprint import NumericsVerdict

NAME = "performance A/B"


def samples_table(outcome: AbOutcome) -> str:
    """Every sample in the order taken, one line each, tab-separated."""
    metrics = [d.metric for d in outcome.decisions]
    lines = ["\t".join(["sequence", "block", "pair", "arm", "at_s", *metrics])]
    for s in outcome.samples:
        values = [f"{s.values[m]:.6g}" if m in s.values else "" for m in metrics]
        lines.append("\t".join([str(s.sequence), str(s.block), str(s.pair), s.arm,
                                f"{s.at_s:.2f}", *values]))
    return "\n".join(lines) + "\n"


def status_of(outcome: AbOutcome) -> tuple[str, dict[str, Any]]:
    """The Allure status and statusDetails of the comparison (pure)."""
    if outcome.failed:
        regressed = [d.metric for d in outcome.decisions if d.verdict is AbVerdict.REGRESSED]
        said = [f"regressed: {', '.join(regressed)}"] if regressed else []
        if outcome.numerics.verdict is NumericsVerdict.CHANGED:
            said.append(f"numbers changed: {outcome.numerics.reason}")
        return "failed", {"message": "; ".join(said)}
    pending = undecided(outcome)
    if not pending:
        return "passed", {}
    shown = []
    for decision in outcome.decisions:
        if decision.metric not in pending:
            continue
        interval = decision.interval
        shown.append(f"{decision.metric} " + (
            "(no interval yet)" if interval is None else
            f"{interval.ratio:.3f} [{interval.low:.3f}, {interval.high:.3f}]"))
    lines = undecided_lines(outcome.decisions, failed=False, elapsed_s=outcome.elapsed_s,
                            min_pairs=outcome.settings.rule.min_pairs)
    return "unknown", {
        "message": "undecided (neither a regression nor its absence shown): "
                   + "; ".join(shown),
        "trace": "\n".join(lines)}


def write_allure_result(outcome: AbOutcome, results_dir: Path) -> Path:
    """Add the result and its attachments to ``results_dir``; returns the result file."""
    results_dir.mkdir(parents=True, exist_ok=True)
    result_id = str(uuid.uuid4())
    attachments = []
    for name, suffix, kind, body in (
            ("verdicts", "txt", "text/plain", table(outcome).encode()),
            ("paired samples (table)", "tsv", "text/tab-separated-values",
             samples_table(outcome).encode()),
            ("paired samples (plot)", "png", "image/png", paired_samples_png(outcome))):
        source = f"{uuid.uuid4()}-attachment.{suffix}"
        (results_dir / source).write_bytes(body)
        attachments.append({"name": name, "source": source, "type": kind})
    stop = int(time.time() * 1000)
    status, details = status_of(outcome)
    result = {
        "uuid": result_id, "historyId": NAME, "testCaseId": NAME, "name": NAME,
        "fullName": f"harness.ab#{NAME}",
        "status": status, "statusDetails": details,
        "stage": "finished", "start": stop - int(outcome.elapsed_s * 1000), "stop": stop,
        "labels": [{"name": "suite", "value": "performance A/B"},
                   {"name": "parentSuite", "value": "harness ab"}],
        "attachments": attachments,
        "parameters": [{"name": "baseline", "value": outcome.baseline.describe()},
                       {"name": "candidate", "value": outcome.candidate.describe()}],
    }
    path = results_dir / f"{result_id}-result.json"
    write_json_atomic(path, result)
    return path
