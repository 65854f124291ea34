"""The paired samples of an A/B comparison as a PNG (one panel per metric).

Each pair is drawn as a line from its baseline value to its candidate value, in the
order the pairs were taken, so drift (both arms moving together) and a real change
(every line sloping the same way) look different at a glance.
"""

from __future__ import annotations

import io

import matplotlib

matplotlib.use("Agg")  # no display: the plot is only ever written to a file

import matplotlib.pyplot as plt

from harness.ab.design import paired_values
from harness.ab.runner import AbOutcome
from harness.results.run_record import METRICS


def paired_samples_png(outcome: AbOutcome) -> bytes:
    """The PNG bytes of the plot."""
    metrics = [d.metric for d in outcome.decisions]
    figure, axes = plt.subplots(1, len(metrics), figsize=(4.2 * len(metrics), 3.6),
                                squeeze=False)
    try:
        for axis, decision in zip(axes[0], outcome.decisions, strict=True):
            baseline, candidate = paired_values(outcome.samples, decision.metric)
            for index, (b, c) in enumerate(zip(baseline, candidate, strict=True)):
                axis.plot([index, index + 0.4], [b, c], color="0.6", linewidth=0.8)
            axis.scatter(range(len(baseline)), baseline, s=12, label="baseline")
            axis.scatter([i + 0.4 for i in range(len(candidate))], candidate, s=12,
                         label="candidate")
            ratio = (f"ratio {decision.interval.ratio:.3f} "
                     f"[{decision.interval.low:.3f}, {decision.interval.high:.3f}]"
                     if decision.interval else "no interval yet")
            axis.set_title(f"{decision.metric}: {decision.verdict}\n{ratio}", fontsize=9)
            axis.set_xlabel("pair, in the order taken")
            axis.set_ylabel(METRICS[decision.metric].unit)
            axis.legend(fontsize=7)
        figure.tight_layout()
        out = io.BytesIO()
        figure.savefig(out, format="png", dpi=100)
        return out.getvalue()
    finally:
        plt.close(figure)
