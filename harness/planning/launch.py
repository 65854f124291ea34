"""A llama-server launch: the model, drafter and flags, and their argv (pure).

One table maps each field to llama-server's long flag name (common/arg.cpp of the
pinned source), so ``to_argv`` and ``from_argv`` are inverses and a test can check
every flag the planner may emit against the built server's own ``--help``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``-lv 4`` is INFO: below it llama-server hides ``using device``, the buffer sizes and
#: the KV-cache line the verdicts read (DESIGN.md, "Log verbosity").
INFO_VERBOSITY = 4


@dataclass(frozen=True)
class LaunchSpec:
    """What to start. Unset (None/False) fields are left to the server's own defaults."""

    model: Path
    ctx_size: int | None = None
    parallel: int | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: str | None = None
    gpu_layers: int | None = None
    fit: str | None = None
    ctx_checkpoints: int | None = None
    spec_type: str | None = None
    drafter: Path | None = None
    spec_draft_n_min: int | None = None
    spec_draft_n_max: int | None = None
    n_cpu_moe: int | None = None
    cpu_moe: bool = False
    n_cpu_ffn: int | None = None
    no_kv_offload: bool = False
    threads: int | None = None
    log_verbosity: int = INFO_VERBOSITY
    metrics: bool = False
    extra_args: tuple[str, ...] = ()

    def to_argv(self, binary: str, host: str, port: int) -> list[str]:
        """The exact command line; ``port`` 0 lets the server pick a free port itself."""
        argv = [binary, "--host", host, "--port", str(port)]
        for name, flag in VALUE_FLAGS:
            value = getattr(self, name)
            if value is not None:
                argv += [flag, str(value)]
        argv += [flag for name, flag in SWITCH_FLAGS if getattr(self, name)]
        argv.extend(self.extra_args)
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> LaunchSpec:
        """Parse ``to_argv``'s output back (binary, host and port are dropped)."""
        by_flag = {flag: name for name, flag in VALUE_FLAGS}
        switches = {flag: name for name, flag in SWITCH_FLAGS}
        types = {field.name: field.type for field in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        extra: list[str] = []
        args = iter(argv[1:])
        for arg in args:
            if arg in ("--host", "--port"):
                next(args)
            elif arg in by_flag:
                name = by_flag[arg]
                values[name] = _convert(str(types[name]), next(args))
            elif arg in switches:
                values[switches[arg]] = True
            else:
                extra.append(arg)
        return cls(**values, extra_args=tuple(extra))


#: Field → llama-server flag taking a value, in argv order (``--model`` first).
VALUE_FLAGS: tuple[tuple[str, str], ...] = (
    ("model", "--model"),
    ("log_verbosity", "--log-verbosity"),
    ("ctx_size", "--ctx-size"),
    ("parallel", "--parallel"),
    ("batch_size", "--batch-size"),
    ("ubatch_size", "--ubatch-size"),
    ("cache_type_k", "--cache-type-k"),
    ("cache_type_v", "--cache-type-v"),
    ("flash_attn", "--flash-attn"),
    ("gpu_layers", "--n-gpu-layers"),
    ("fit", "--fit"),
    ("ctx_checkpoints", "--ctx-checkpoints"),
    ("spec_type", "--spec-type"),
    ("drafter", "--spec-draft-model"),
    ("spec_draft_n_min", "--spec-draft-n-min"),
    ("spec_draft_n_max", "--spec-draft-n-max"),
    ("n_cpu_moe", "--n-cpu-moe"),
    ("n_cpu_ffn", "--n-cpu-ffn"),
    ("threads", "--threads"),
)
#: Field → llama-server flag that is present or absent.
SWITCH_FLAGS: tuple[tuple[str, str], ...] = (
    ("cpu_moe", "--cpu-moe"),
    ("no_kv_offload", "--no-kv-offload"),
    ("metrics", "--metrics"),
)


def emitted_flags() -> tuple[str, ...]:
    """Every flag ``to_argv`` can produce, for checking against a build's ``--help``."""
    return ("--host", "--port", *(f for _, f in VALUE_FLAGS), *(f for _, f in SWITCH_FLAGS))


def _convert(annotation: str, text: str) -> Any:
    if "Path" in annotation:
        return Path(text)
    if "int" in annotation:
        return int(text)
    return text
