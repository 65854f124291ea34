"""A llama-server startup log cut into its model blocks (pure: text in, frozen data out).

A startup log holds up to two *model blocks*, and this module is where they are told apart
(``block_report`` parses each one, ``gpu_use`` and ``residency`` read the same blocks):

- the **target**: from its first ``using device`` / ``llama_model_loader`` / ``load_tensors``
  / ``llama_context`` / ``llama_kv_cache`` line to the drafter's first line (or the end of
  loading);
- the **drafter**: common/speculative.cpp ``common_speculative_init_result`` announces it
  with ``loading draft model '<path>'`` (a separate GGUF, loaded through the same loader,
  so it has its own ``using device``, ``load_tensors`` and ``llama_context`` lines) or with
  ``creating MTP draft context against the target model '<path>'`` (no model load: a second
  ``llama_context`` on the target's weights).

Both end at the server's ``load_model: initializing, n_slots = …`` line
(tools/server/server-context.cpp). ``--fit`` (on by default) first loads the model with
``no_alloc`` to measure it (common/fit.cpp); at ``-lv 5`` that dry run prints a whole model
block of its own, so everything from ``fitting params to device memory`` to ``fitting
params to free memory took`` is left out of the blocks.

The target's path comes from tools/server/server-context.cpp ``load_model``: ``loading
model '%s'``.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable
from dataclasses import dataclass


class BlockRole(enum.StrEnum):
    """Whose block a part of the log is: the served model, or its speculative drafter."""

    TARGET = "target"
    DRAFTER = "drafter"


class BlockKind(enum.StrEnum):
    """What a block loads: a model (GGUF + context) or only an MTP context on the target.

    The two ways common/speculative.cpp ``common_speculative_init_result`` makes a draft
    context: a draft model file, or ``LLAMA_CONTEXT_TYPE_MTP`` on the target model.
    """

    MODEL = "model"
    MTP_CONTEXT = "mtp-context"


@dataclass(frozen=True)
class LogBlock:
    """The raw lines of one model block, as ``split_blocks`` cut them."""

    role: BlockRole
    kind: BlockKind
    model_path: str | None
    lines: tuple[str, ...]


#: ``0.00.011.270 I `` / ``D `` …: common/log.cpp's timestamp and level letter.
_PREFIX = re.compile(r"^\d+\.\d{2}\.\d{3}\.\d{3} [IWED] ")
_FIT_START = re.compile(r"fitting params to device memory|getting device memory data")
_FIT_END = re.compile(r"fitting params to free memory took")
_TARGET_PATH = re.compile(r"load_model: loading model '(?P<path>[^']*)'")
_TARGET_START = re.compile(
    r"using device |llama_model_loader: |load_tensors: |llama_context: |llama_kv_cache")
#: The drafter's first line; ``launch_report`` also reads the drafter's path from it.
DRAFT_MODEL_LINE = re.compile(r"loading draft model '(?P<path>[^']*)'")
_MTP_CONTEXT = re.compile(r"creating MTP draft context against the target model '(?P<path>[^']*)'")
#: The line that ends loading; ``launch_report`` also reads the server's slots from it.
SLOTS_LINE = re.compile(
    r"initializing, n_slots = (?P<slots>\d+), n_ctx_slot = (?P<ctx>\d+), "
    r"kv_unified = '(?P<unified>true|false)'")
#: The same end of loading as older releases print it (b9093 and b9596 here): the slot
#: count alone, then ``new slot, n_ctx = N`` for each slot; ``launch_report`` reads both.
OLD_SLOTS_LINE = re.compile(r"initializing slots, n_slots = (?P<slots>\d+)")


def message(line: str) -> str:
    """A log line without common/log.cpp's timestamp and level letter."""
    return _PREFIX.sub("", line, count=1)


def first_group(pattern: re.Pattern[str], texts: Iterable[str], group: str) -> str | None:
    """``group`` of the first of ``texts`` that ``pattern`` finds, None when none does."""
    return next((found[group] for text in texts if (found := pattern.search(text))), None)


def _drafter_start(line: str) -> tuple[BlockKind, str] | None:
    if found := DRAFT_MODEL_LINE.search(line):
        return BlockKind.MODEL, found["path"]
    if found := _MTP_CONTEXT.search(line):
        return BlockKind.MTP_CONTEXT, found["path"]
    return None


def split_blocks(log: str) -> tuple[LogBlock, ...]:
    """The target and drafter blocks of ``log``, in order (see the module docstring)."""
    blocks: list[LogBlock] = []
    current: tuple[BlockRole, BlockKind, str | None] | None = None
    lines: list[str] = []
    target_path: str | None = None
    in_fit = done = False

    def close() -> None:
        if current is not None:
            blocks.append(LogBlock(current[0], current[1], current[2], tuple(lines)))
        lines.clear()

    for line in log.splitlines():
        if done:
            break
        if in_fit:
            in_fit = _FIT_END.search(line) is None
            continue
        if _FIT_START.search(line):
            in_fit = True
            continue
        if (found := _TARGET_PATH.search(line)) and current is None:
            target_path = found["path"]
            continue
        if starts := _drafter_start(line):
            close()
            current = (BlockRole.DRAFTER, *starts)
            continue
        if SLOTS_LINE.search(line) or OLD_SLOTS_LINE.search(line):
            done = True
            continue
        if current is None:
            if not _TARGET_START.search(line):
                continue
            current = (BlockRole.TARGET, BlockKind.MODEL, target_path)
        lines.append(line)
    close()
    return tuple(blocks)
