"""The run's figures against its baseline, as a picture for the Allure report's front page.

The baseline is the window of runs before this one on the same branch and hardware (what
a nightly cell is compared with); each figure is judged with the gate's history rule
(:func:`harness.results.comparison.compare_figures`) and drawn as its change from the
baseline mean, coloured by the verdict, with the rule's relative threshold marked. The
picture goes into the report as an Allure 3 global attachment (``harness report`` and
``harness run``), so it sits beside the tests rather than inside one of them.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from harness.report.global_attachments import GlobalAttachment
from harness.results.comparison import FigureResult, compare_figures
from harness.results.noise_rule import DEFAULT_NOISE_RULE, NoiseRule
from harness.results.rules import NOISE_WINDOW, FigureStatus
from harness.results.run_record import RunRecord
from harness.results.store import ResultsStore, open_store

ATTACHMENT_NAME = "figures against the baseline"
_COLOURS = {FigureStatus.REGRESSED: "#d62728", FigureStatus.IMPROVED: "#2ca02c",
            FigureStatus.UNCHANGED: "#1f77b4"}


def baseline_runs(run: RunRecord, store: ResultsStore,
                  window: int = NOISE_WINDOW) -> list[RunRecord]:
    """Up to ``window`` runs before ``run`` on its branch and hardware, newest first."""
    earlier = store.list_runs(branch=run.branch, hardware=run.hardware.identity,
                              limit=window + 1)
    return [r for r in earlier if r.run_id != run.run_id and r.started_at <= run.started_at
            ][:window]


def baseline_attachment(run: RunRecord, baseline: Sequence[RunRecord],
                        rule: NoiseRule = DEFAULT_NOISE_RULE) -> GlobalAttachment | None:
    """The PNG of ``run``'s judged figures, or None without a baseline to judge them by."""
    results = [r for r in compare_figures(baseline, run, rule)
               if r.current is not None and r.judgement.change is not None]
    if not baseline or not results:
        return None
    return GlobalAttachment(ATTACHMENT_NAME, figures_png(results, run, len(baseline), rule),
                            "image/png", "png")


def figures_png(results: Sequence[FigureResult], run: RunRecord, baseline_runs: int,
                rule: NoiseRule) -> bytes:
    """A horizontal bar per figure: its change from the baseline mean, in percent."""
    ordered = sorted(results, key=lambda r: (r.metric, r.label))
    height = max(2.5, 0.28 * len(ordered) + 1.2)
    # Imported here: matplotlib costs every ``harness run`` and ``harness report`` about
    # 0.7 s to import, and only a run with a baseline draws.
    from matplotlib.figure import Figure  # noqa: PLC0415

    figure = Figure(figsize=(9, height), layout="constrained")
    axes = figure.add_subplot()
    changes = [100 * (r.judgement.change or 0.0) for r in ordered]
    axes.barh(range(len(ordered)), changes,
              color=[_COLOURS.get(r.status, "#7f7f7f") for r in ordered])
    axes.set_yticks(range(len(ordered)), [f"{r.metric} · {r.label}" for r in ordered],
                    fontsize=7)
    axes.invert_yaxis()
    for edge in (-100 * rule.threshold, 100 * rule.threshold):
        axes.axvline(edge, color="#7f7f7f", linestyle="--", linewidth=0.8)
    axes.axvline(0, color="black", linewidth=0.8)
    axes.set_xlabel("change from the baseline mean, % (red: regressed, green: improved)")
    axes.set_title(f"run {run.run_id} against {baseline_runs} earlier runs of {run.branch}",
                   fontsize=9)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    return buffer.getvalue()


def baseline_picture(run: RunRecord, results_url: str | None) -> tuple[GlobalAttachment, ...]:
    """The picture for ``run`` from the store at ``results_url``; none without a baseline.

    Raises HarnessError when the store cannot be read (the caller warns and goes on: a
    report without the picture beats none).
    """
    with open_store(results_url) as store:
        picture = baseline_attachment(run, baseline_runs(run, store))
    return () if picture is None else (picture,)
