"""Deterministic counters of a server start, and how they differ between two builds (pure).

Timings are noise to be tested; these are not. For one server start and one
temperature-0 completion of a fixed prompt, these come out the same every time a build is
started the same way, so a difference between baseline and candidate is a change in
the build itself, reported with both values rather than tested for significance:

- from the startup log (cut into target and drafter blocks by
  ``harness.verdicts.launch_report``, buffers summed per name as
  ``harness.verdicts.residency`` does): ``layers_offloaded`` (``N/M`` of ``offloaded N/M
  layers to GPU``, a line only a build with a GPU device prints, so a CPU build has no
  such counter rather than a made-up ``0/M``), ``model_mib[<buffer>]``,
  ``kv_mib[<buffer>]`` and ``compute_mib[<buffer>]`` per ggml buffer name (``CPU_Mapped``,
  ``CUDA0``, ``Vulkan_Host``, …). The drafter's block gives the same names with a
  ``drafter.`` prefix.
- from the ``/completion`` response (tools/server/server-task.cpp, ``timings`` from
  server-common.cpp ``server_slot_stats::to_json``): ``greedy_text`` (``content``),
  ``prompt_tokens`` (``timings.prompt_n``), ``predicted_tokens`` (``timings.predicted_n``),
  and ``drafted_tokens`` / ``accepted_tokens`` (``timings.draft_n`` /
  ``timings.draft_n_accepted``, which the server adds only when a drafter proposed
  tokens).

Values are strings exactly as printed (the logs' ``%8.2f`` MiB go through ``Decimal``, which
keeps their digits), so comparing them is comparing text: no float rounding can make two
values equal or different.

Deterministic is a claim, so ``compare_counters`` checks it: with several starts per arm,
a counter that differs between starts of one build (a compute buffer sized by a
free-memory fit, a text that depends on thread timing) is listed as not deterministic and
never reported as a change.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from harness.verdicts.block_report import BufferSize, parse_block
from harness.verdicts.log_blocks import BlockRole, split_blocks
from harness.verdicts.residency import Holding, block_residency

#: The value shown for a counter one side does not have.
MISSING = "missing"

LAYERS_OFFLOADED = "layers_offloaded"
GREEDY_TEXT = "greedy_text"
PROMPT_TOKENS = "prompt_tokens"
PREDICTED_TOKENS = "predicted_tokens"
DRAFTED_TOKENS = "drafted_tokens"
ACCEPTED_TOKENS = "accepted_tokens"

#: Counter name -> the ``timings`` field it is read from.
_TIMING_COUNTERS = {
    PROMPT_TOKENS: "prompt_n",
    PREDICTED_TOKENS: "predicted_n",
    DRAFTED_TOKENS: "draft_n",
    ACCEPTED_TOKENS: "draft_n_accepted",
}


def buffer_counter(kind: str, buffer: str, role: BlockRole = BlockRole.TARGET) -> str:
    """The name of a buffer counter: ``kv_mib[CUDA0]``, ``drafter.model_mib[CPU_Mapped]``.

    ``kind``: ``model``, ``kv`` or ``compute``.
    """
    return f"{_prefix(role)}{kind}_mib[{buffer}]"


def _prefix(role: BlockRole) -> str:
    return "" if role is BlockRole.TARGET else f"{role.value}."


# --- one start -------------------------------------------------------------------------------


def read_counters(log_text: str, completion: Mapping[str, Any] | None) -> dict[str, str]:
    """The deterministic counters of one server start (module docstring for the names).

    ``log_text``: the server's startup log; ``completion``: the JSON of one temperature-0
    ``/completion`` of the fixed prompt, or None when there is none (the start failed).
    A counter the log or the response does not carry, or carries in a shape the server
    does not print (a non-integer token count), is left out: an absent counter shows as
    ``missing`` against the other build, where a guessed value could hide a change.
    """
    counters: dict[str, str] = {}
    for block in split_blocks(log_text):
        report = parse_block(block)
        prefix = _prefix(report.role)
        if report.offloaded_layers is not None:
            done, total = report.offloaded_layers
            counters[prefix + LAYERS_OFFLOADED] = f"{done}/{total}"
        held = block_residency(report)
        counters.update(_mib_counters("model", _held(held.weights), report.role))
        counters.update(_mib_counters("kv", _held(held.kv), report.role))
        counters.update(_mib_counters("compute", _summed(report.compute_buffers), report.role))
    if completion is not None:
        counters.update(_completion_counters(completion))
    return counters


def _mib_counters(kind: str, sizes: Iterable[tuple[str, Decimal]], role: BlockRole,
                  ) -> dict[str, str]:
    return {buffer_counter(kind, buffer, role): str(mib) for buffer, mib in sizes}


def _held(holdings: Iterable[Holding]) -> Iterator[tuple[str, Decimal]]:
    return ((h.buffer, h.mib) for h in holdings)


def _summed(buffers: Iterable[BufferSize]) -> Iterator[tuple[str, Decimal]]:
    # residency sums model and KV lines per buffer name (an SWA model prints two KV lines
    # for one buffer); compute lines get the same treatment so that every MiB counter
    # means "MiB in this buffer". Decimal addition keeps the printed two decimals.
    total: dict[str, Decimal] = {}
    for buf in buffers:
        total[buf.buffer] = total.get(buf.buffer, Decimal(0)) + buf.mib
    return iter(total.items())


def _completion_counters(completion: Mapping[str, Any]) -> dict[str, str]:
    counters: dict[str, str] = {}
    content = completion.get("content")
    if isinstance(content, str):
        counters[GREEDY_TEXT] = content
    timings = completion.get("timings")
    if isinstance(timings, Mapping):
        for name, field in _TIMING_COUNTERS.items():
            value = timings.get(field)
            # bool is an int to Python, never a count to the server.
            if isinstance(value, int) and not isinstance(value, bool):
                counters[name] = str(value)
    return counters


# --- two builds ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CounterChange:
    """A deterministic counter whose value differs between the builds (``missing``: absent)."""

    name: str
    baseline: str
    candidate: str


@dataclass(frozen=True)
class CounterReport:
    """Every counter seen in either build, sorted into exactly one of three kinds."""

    changed: tuple[CounterChange, ...]
    unchanged: tuple[str, ...]
    #: Counters that differed between starts of one build: not comparable, so never a change.
    not_deterministic: tuple[str, ...]


def compare_counters(baseline: Sequence[Mapping[str, str]],
                     candidate: Sequence[Mapping[str, str]]) -> CounterReport:
    """Sort each counter into changed, unchanged or not deterministic.

    Each arm holds one ``read_counters`` dict per server start. A counter absent from some
    starts of an arm and present in others varies within that arm. With one start per arm
    nothing can be seen to vary, so every counter counts as deterministic. Names keep the
    order they first appear in (baseline first), which is the log's order. Raises
    ValueError when an arm has no start: there is nothing to compare against.
    """
    if not baseline or not candidate:
        raise ValueError("compare_counters needs at least one server start in each arm "
                         f"(baseline {len(baseline)}, candidate {len(candidate)})")
    names = dict.fromkeys(name for counters in (*baseline, *candidate) for name in counters)
    changed: list[CounterChange] = []
    unchanged: list[str] = []
    varying: list[str] = []
    for name in names:
        base = {counters.get(name, MISSING) for counters in baseline}
        cand = {counters.get(name, MISSING) for counters in candidate}
        if len(base) > 1 or len(cand) > 1:
            varying.append(name)
        elif base == cand:
            unchanged.append(name)
        else:
            changed.append(CounterChange(name, base.pop(), cand.pop()))
    return CounterReport(tuple(changed), tuple(unchanged), tuple(varying))


# --- output ----------------------------------------------------------------------------------

#: Markdown cells longer than this are cut with an ellipsis (JSON keeps every character).
CELL_CHARS = 80
#: Characters kept before the first difference when a long value is cut to show it.
_LEAD = 20
#: Counters holding free text: quoted in markdown, so that spaces and newlines show.
_TEXT_COUNTERS = frozenset({GREEDY_TEXT})


def counters_json(report: CounterReport) -> dict[str, Any]:
    """The report as plain JSON, every value whole."""
    return {
        "changed": [{"name": c.name, "baseline": c.baseline, "candidate": c.candidate}
                    for c in report.changed],
        "unchanged": list(report.unchanged),
        "not_deterministic": list(report.not_deterministic),
    }


def counters_markdown(report: CounterReport) -> str:
    """A table of the changed counters, then one line each for the rest."""
    compared = len(report.changed) + len(report.unchanged)
    lines: list[str] = []
    if report.changed:
        lines += [f"**{len(report.changed)} of {compared} deterministic counters changed**",
                  "", "| counter | baseline | candidate |", "|---|---|---|"]
        for change in report.changed:
            base, cand = _pair_cells(change)
            lines.append(f"| {_escape_cell(change.name)} | {base} | {cand} |")
        lines.append("")
    else:
        lines.append(f"No deterministic counter changed ({compared} compared).")
    if report.changed and report.unchanged:
        lines.append(f"Unchanged: {len(report.unchanged)}.")
    if report.not_deterministic:
        lines.append("Not deterministic (differed between starts of one build, not compared): "
                     + ", ".join(report.not_deterministic) + ".")
    return "\n".join(lines) + "\n"


def _pair_cells(change: CounterChange) -> tuple[str, str]:
    base, cand = (_visible(change.name, v) for v in (change.baseline, change.candidate))
    start = 0
    if MISSING not in (change.baseline, change.candidate):
        # Two long texts that agree for their first 80 characters would print the same
        # cut; start both at the same place just before they part instead.
        first = next((i for i, (a, b) in enumerate(zip(base, cand, strict=False)) if a != b),
                     min(len(base), len(cand)))
        if first > CELL_CHARS - _LEAD:
            start = first - _LEAD
    return _escape_cell(_cut(base, start)), _escape_cell(_cut(cand, start))


def _visible(name: str, value: str) -> str:
    if value == MISSING or name not in _TEXT_COUNTERS:
        return value
    return json.dumps(value, ensure_ascii=False)


def _cut(text: str, start: int) -> str:
    shown = ("…" + text[start:]) if start else text
    return shown if len(shown) <= CELL_CHARS else shown[:CELL_CHARS - 1] + "…"


def _escape_cell(text: str) -> str:
    # The pipe escape comes after the cut, so that the cut never splits one.
    return text.replace("|", "\\|").replace("\n", " ")
