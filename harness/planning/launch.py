"""A llama-server launch: the model, drafter and flags, and their argv (pure)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: ``-lv 4`` is INFO: below it llama-server hides ``using device``, the buffer sizes and
#: the KV-cache line the verdicts read (DESIGN.md, "Log verbosity").
INFO_VERBOSITY = 4


@dataclass(frozen=True)
class LaunchSpec:
    """What to start. Unset fields are left to the server's own defaults."""

    model: Path
    ctx_size: int | None = None
    parallel: int | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    drafter: Path | None = None
    spec_type: str | None = None
    gpu_layers: int | None = None
    threads: int | None = None
    log_verbosity: int = INFO_VERBOSITY
    metrics: bool = False
    extra_args: tuple[str, ...] = ()

    def to_argv(self, binary: str, host: str, port: int) -> list[str]:
        """The exact command line; ``port`` 0 lets the server pick a free port itself."""
        argv = [binary, "-m", str(self.model), "--host", host, "--port", str(port),
                "-lv", str(self.log_verbosity)]
        optional: tuple[tuple[str, object | None], ...] = (
            ("-c", self.ctx_size),
            ("-np", self.parallel),
            ("-b", self.batch_size),
            ("-ub", self.ubatch_size),
            ("-ctk", self.cache_type_k),
            ("-ctv", self.cache_type_v),
            ("-ngl", self.gpu_layers),
            ("-t", self.threads),
            ("--spec-type", self.spec_type),
            ("--spec-draft-model", self.drafter),
        )
        for flag, value in optional:
            if value is not None:
                argv += [flag, str(value)]
        if self.metrics:
            argv.append("--metrics")
        argv.extend(self.extra_args)
        return argv
