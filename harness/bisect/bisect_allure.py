"""A bisect as one Allure result: the table, and a plot of every probed commit in
commit order with the first bad commit marked.

Written into a run's ``allure-results`` folder (``harness bisect --allure-results``), so
the report of the run whose regression it explains shows it beside the failing tests.
A measured probe (``--metric``) is drawn as its ratio to the good build with the
interval; the other oracles' probes as their verdicts.
"""

from __future__ import annotations

import io
import time
import uuid
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display: the plot is only ever written to a file

import matplotlib.pyplot as plt

from harness.bisect.bisector import BisectResult
from harness.bisect.search import Verdict
from harness.bisect.table import answer, render_table
from harness.facts.commit_ids import short_commit
from harness.files import write_json_atomic

NAME = "bisect"
_LEVEL = {Verdict.GOOD: 0.0, Verdict.BAD: 1.0, Verdict.SKIP: 0.5, Verdict.UNDECIDED: 0.5}
_COLOUR = {Verdict.GOOD: "tab:green", Verdict.BAD: "tab:red", Verdict.SKIP: "0.6",
           Verdict.UNDECIDED: "tab:orange"}


def probes_png(result: BisectResult) -> bytes:
    """The PNG bytes of the probes' plot."""
    probes = result.probes
    measured = any(p.ratio is not None for p in probes)
    culprit = (result.commit_at(result.window.culprit).sha
               if result.window is not None and result.window.culprit is not None else None)
    figure, axis = plt.subplots(figsize=(max(5.0, 0.7 * len(probes) + 2), 3.8))
    try:
        for x, probe in enumerate(probes):
            colour = _COLOUR[probe.verdict]
            if measured and probe.ratio is not None:
                ratio, low, high = probe.ratio
                axis.errorbar([x], [ratio], yerr=[[ratio - low], [high - ratio]], fmt="o",
                              color=colour, capsize=3)
            elif not measured:
                axis.scatter([x], [_LEVEL[probe.verdict]], color=colour, s=40)
            else:  # the reference, or a build that failed: no ratio
                axis.scatter([x], [1.0], color=colour, marker="x", s=40)
            if probe.commit == culprit:
                axis.axvline(x, color="tab:red", linestyle="--", linewidth=1)
                axis.annotate("first bad", (x, axis.get_ylim()[1]), fontsize=8,
                              color="tab:red", ha="center", va="bottom")
        axis.set_xticks(range(len(probes)),
                        [f"{short_commit(p.commit)}\n{p.verdict.value}" for p in probes],
                        fontsize=7, rotation=30, ha="right")
        if measured:
            axis.axhline(1.0, color="0.7", linewidth=0.8)
            axis.set_ylabel("ratio to the good build")
        else:
            axis.set_yticks([0.0, 0.5, 1.0], ["good", "skip", "bad"])
        axis.set_title(result.oracle or "bisect", fontsize=9)
        axis.set_xlabel("probed commits, in commit order")
        figure.tight_layout()
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=100)
        return out.getvalue()
    finally:
        plt.close(figure)


def write_allure_result(result: BisectResult, results_dir: Path, seconds: float) -> Path:
    """Add the result and its attachments to ``results_dir``; returns the result file."""
    results_dir.mkdir(parents=True, exist_ok=True)
    attachments = []
    for name, suffix, kind, body in (
            ("probes (table)", "md", "text/markdown", render_table(result).encode()),
            ("probes (plot)", "png", "image/png", probes_png(result))):
        source = f"{uuid.uuid4()}-attachment.{suffix}"
        (results_dir / source).write_bytes(body)
        attachments.append({"name": name, "source": source, "type": kind})
    stop = int(time.time() * 1000)
    result_id = str(uuid.uuid4())
    found = result.window is not None and result.window.culprit is not None
    record = {
        "uuid": result_id, "historyId": NAME, "testCaseId": NAME, "name": NAME,
        "fullName": f"harness.bisect#{NAME}",
        # It explains a regression, it is not one: broken only when it could not say.
        "status": "passed" if found else "broken",
        "statusDetails": {"message": answer(result)},
        "stage": "finished", "start": stop - int(seconds * 1000), "stop": stop,
        "labels": [{"name": "suite", "value": "bisect"},
                   {"name": "parentSuite", "value": "harness bisect"}],
        "attachments": attachments,
        "parameters": [{"name": "good", "value": result.history[0].sha},
                       {"name": "bad", "value": result.history[-1].sha},
                       {"name": "oracle", "value": result.oracle}],
    }
    path = results_dir / f"{result_id}-result.json"
    write_json_atomic(path, record)
    return path
