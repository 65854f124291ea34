"""Where two builds' numbers part: the first tensor of a forward pass that differs (pure).

llama.cpp's eval callback (``common/debug.cpp`` ``common_debug_cb_eval``, the
``llama-eval-callback`` example) prints every tensor of the graph as it is computed, in
graph order: a header ``common_debug_cb_eval: <name> = (<type>) <OP>(<src0>{…}, <src1>{…})
= {<shape>}``, the first and last three values of each row (``%12.4f``), and ``sum =
%f`` over all of them. Two builds run on the same model and prompt print the same
tensors in the same order; the first whose values or sum differ is where a wrong number
entered (``norm-0``, ``Qcur-0`` after its ``ROPE``, ``kq``…), and everything after it
only carries the difference on.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

_HEADER = re.compile(r"^common_debug_cb_eval:\s+(?P<name>.+?) = \((?P<type>\w+)\)\s+"
                     r"(?P<op>[^(\s]+)\((?P<srcs>.*)\) = \{(?P<shape>[^}]*)\}\s*$")
_SUM = re.compile(r"^\s+sum = (?P<sum>-?(?:\d+\.\d+|inf|nan))\s*$")
_NUMBER = re.compile(r"-?(?:\d+\.\d+|inf|nan)")
#: Values are printed with 4 decimals: a difference of more than one unit in the last
#: one is a change, not the print's rounding.
VALUE_TOLERANCE = 1.5e-4
#: Sums are float32 totals printed with 6 decimals: relative to their size.
SUM_TOLERANCE = 1e-5


@dataclass(frozen=True)
class TensorDump:
    """One tensor as the callback printed it; quantized ones have no values or sum."""

    name: str
    op: str
    type: str
    shape: str
    values: tuple[float, ...]
    sum: float | None


def parse_dump(text: str) -> list[TensorDump]:
    """Every tensor in ``text`` (the callback's output; other lines are ignored)."""
    tensors: list[TensorDump] = []
    head: re.Match[str] | None = None
    values: list[float] = []

    def close(total: float | None) -> None:
        assert head is not None
        tensors.append(TensorDump(head["name"].strip(), head["op"], head["type"],
                                  head["shape"].strip(), tuple(values), total))

    for line in text.splitlines():
        if found := _HEADER.match(line):
            if head is not None:
                close(None)  # a quantized tensor: no values, no sum
            head, values = found, []
        elif head is not None and (total := _SUM.match(line)):
            close(float(total["sum"]))
            head = None
        elif head is not None and line.lstrip().startswith("["):
            values += [float(v) for v in _NUMBER.findall(line)]
    if head is not None:
        close(None)
    return tensors


@dataclass(frozen=True)
class TensorDifference:
    """The first tensor that differs: its place in the graph and both prints."""

    index: int
    baseline: TensorDump
    candidate: TensorDump
    why: str

    def describe(self) -> str:
        cand = self.candidate
        return (f"the first tensor that differs is {cand.name} ({cand.op}, {cand.shape}), "
                f"node {self.index} of the graph: {self.why}")


def _close(a: float, b: float, tolerance: float) -> bool:
    if a == b:  # the same infinity too, whose difference is nan
        return True
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return abs(a - b) <= tolerance


def first_difference(baseline: list[TensorDump],
                     candidate: list[TensorDump]) -> TensorDifference | None:
    """The first tensor, in graph order, whose print differs beyond the print's own
    precision; None when every tensor both prints hold agrees."""
    for index, (base, cand) in enumerate(zip(baseline, candidate, strict=False)):
        if (base.name, base.op, base.shape) != (cand.name, cand.op, cand.shape):
            return TensorDifference(index, base, cand, f"the graphs part here: the baseline "
                                    f"computes {base.name} ({base.op}, {base.shape})")
        moved = [(a, b) for a, b in zip(base.values, cand.values, strict=False)
                 if not _close(a, b, VALUE_TOLERANCE)]
        if moved:
            a, b = moved[0]
            return TensorDifference(index, base, cand,
                                    f"{len(moved)} of {len(base.values)} printed values "
                                    f"differ, the first {a:.4f} against {b:.4f}")
        if base.sum is not None and cand.sum is not None and not _close(
                base.sum, cand.sum, SUM_TOLERANCE * max(1.0, abs(base.sum))):
            return TensorDifference(index, base, cand,
                                    f"sum {base.sum:.6f} against {cand.sum:.6f}")
    # One print longer than the other is not a difference: the tool's log is written by
    # a thread of its own and can end a few tensors early when the process exits
    # (measured: 188 of 195 tensors on one run of the same build).
    return None
