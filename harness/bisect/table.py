"""The bisect's table and its progress lines, for a terminal (pure)."""

from __future__ import annotations

from harness.bisect.bisector import BisectResult
from harness.bisect.journal import Probe
from harness.bisect.search import probes_left
from harness.facts.commit_ids import short_commit

_SUBJECT_WIDTH = 48
_EVIDENCE_WIDTH = 90


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def progress_line(probe: Probe, state: BisectResult) -> str:
    """One line after each probe: what it was, what it said, what is left."""
    build = "cache hit" if probe.cache_hit else f"built in {probe.build_s:.0f} s"
    line = (f"{short_commit(probe.commit)} {probe.verdict.value:<4} ({build}, judged in "
            f"{probe.judge_s:.0f} s) {_clip(probe.subject, _SUBJECT_WIDTH)}")
    if state.window is not None:
        count, left = len(state.window.candidates), probes_left(state.window)
        line += (f" — {count} candidate{'s' if count != 1 else ''}, about {left} "
                 f"probe{'s' if left != 1 else ''} left")
    return line


def render_table(result: BisectResult) -> str:
    """Every probed commit in commit order, the first bad one marked, then the answer."""
    culprit = (result.commit_at(result.window.culprit).sha
               if result.window is not None and result.window.culprit is not None else None)
    rows = ["| commit | subject | verdict | evidence | build key | build s | judge s |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for probe in result.probes:
        mark = " **first bad**" if probe.commit == culprit else ""
        build_s = "hit" if probe.cache_hit else f"{probe.build_s:.0f}"
        subject = _clip(probe.subject, _SUBJECT_WIDTH)
        rows.append(f"| {short_commit(probe.commit)}{mark} | {subject} | "
                    f"{probe.verdict.value} | {_clip(probe.evidence, _EVIDENCE_WIDTH)} | "
                    f"{probe.build_key or '-'} | {build_s} | {probe.judge_s:.0f} |")
    return "\n".join([*rows, "", answer(result)])


def answer(result: BisectResult) -> str:
    """The result in one or a few lines a person acts on."""
    found = result.window
    if found is None:
        good, bad = result.history[0], result.history[-1]
        said = {p.commit: p for p in result.probes}
        parts = []
        for commit, wanted in ((good, "good"), (bad, "bad")):
            probe = said.get(commit.sha)
            if probe is not None and probe.verdict.value != wanted:
                parts.append(f"the {wanted} endpoint {short_commit(commit.sha)} judged "
                             f"{probe.verdict.value} ({probe.evidence})")
        return ("not reproduced: " + "; ".join(parts) +
                ". No bisect was run: check the endpoints and the oracle.")
    if found.culprit is not None and result.stopped is None:
        first = result.commit_at(found.culprit)
        return (f"first bad commit: {first.sha} {first.subject} "
                f"({len(result.probes)} probes over {len(result.history)} commits)")
    listed = "\n".join(f"  {result.commit_at(i).sha} {result.commit_at(i).subject}"
                       for i in found.candidates)
    why = result.stopped or "the commits between the last good and the first bad were skipped"
    return f"the first bad commit is one of {len(found.candidates)} ({why}):\n{listed}"
