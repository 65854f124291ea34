"""A llama-server launch: the model, drafter and flags, and their argv (pure).

The tuned settings map to flags through ``SETTING_FIELDS`` (harness/facts/gpu.py), the
one table the GPU configs are validated against; the launch-only fields (model,
drafter, offload switches, verbosity) have their own table here. Both name
llama-server's long options (common/arg.cpp of the pinned source), so ``to_argv`` and
``from_argv`` are inverses and a test checks every flag against the build's ``--help``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.facts.gpu import SETTING_FIELDS, FieldKind, ServerSettings

#: ``-lv 4`` is INFO: below it llama-server hides ``using device``, the buffer sizes and
#: the KV-cache line the verdicts read (docs/design.md, "Log verbosity").
INFO_VERBOSITY = 4


@dataclass(frozen=True)
class LaunchSpec:
    """What to start. Unset (None/False) fields are left to the server's own defaults."""

    model: Path
    # The tuned settings: the same names, meaning and flags as ServerSettings.
    n_gpu_layers: int | None = None
    ctx_size: int | None = None
    parallel: int | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: str | None = None
    split_mode: str | None = None
    main_gpu: int | None = None
    kv_offload: bool | None = None
    load_mode: str | None = None
    ctx_checkpoints: int | None = None
    checkpoint_min_step: int | None = None
    spec_draft_n_min: int | None = None
    spec_draft_n_max: int | None = None
    spec_draft_p_min: float | None = None
    spec_draft_sampling: str | None = None
    lazy_mode: str | None = None
    # Launch-only fields.
    fit: str | None = None
    spec_type: str | None = None
    drafter: Path | None = None
    #: A vision projector (``--mmproj``), and whether it stays off the GPU.
    mmproj: Path | None = None
    no_mmproj_offload: bool = False
    n_cpu_moe: int | None = None
    cpu_moe: bool = False
    n_cpu_ffn: int | None = None
    threads: int | None = None
    #: A spread over several devices (harness.planning.multi_device): units per device,
    #: and the RPC servers that are devices, ``HOST:PORT,...``.
    tensor_split: str | None = None
    rpc: str | None = None
    #: ``--device``: exactly the devices the spread names (``RPC0,RPC1``, ``RPC0,CUDA0``),
    #: so a build's other devices take no part (a GPU build's own card beside RPC devices).
    device: str | None = None
    log_verbosity: int = INFO_VERBOSITY
    metrics: bool = False
    extra_args: tuple[str, ...] = ()

    @classmethod
    def from_settings(cls, model: Path, settings: ServerSettings, **launch: Any) -> LaunchSpec:
        """A spec carrying ``settings`` (enum values as their words) plus launch fields."""
        tuned: dict[str, Any] = {name: getattr(value, "value", value)
                                 for name, value in settings.items()}
        return cls(model=model, **tuned, **launch)

    def settings(self) -> ServerSettings:
        return ServerSettings.from_values(
            {f.name: getattr(self, f.name) for f in SETTING_FIELDS
             if getattr(self, f.name) is not None})

    def to_argv(self, binary: str, host: str, port: int) -> list[str]:
        """The exact command line; ``port`` 0 lets the server pick a free port itself."""
        argv = [binary, "--host", host, "--port", str(port), "--model", str(self.model),
                "--log-verbosity", str(self.log_verbosity)]
        argv += _setting_args(self)
        for name, flag, _ in VALUE_FLAGS:
            value = getattr(self, name)
            if value is not None:
                argv += [flag, str(value)]
        argv += [flag for name, flag in SWITCH_FLAGS if getattr(self, name)]
        argv.extend(self.extra_args)
        return argv

    @classmethod
    def from_argv(cls, argv: list[str]) -> LaunchSpec:
        """Parse ``to_argv``'s output back (binary, host and port are dropped)."""
        values: dict[str, Any] = {}
        extra: list[str] = []
        args = iter(argv[1:])
        for arg in args:
            if arg in ("--host", "--port"):
                next(args)
            elif arg in _BY_FLAG:
                name, convert = _BY_FLAG[arg]
                values[name] = convert(next(args))
            elif arg in _SWITCH_BY_FLAG:
                name, value = _SWITCH_BY_FLAG[arg]
                values[name] = value
            else:
                extra.append(arg)
        return cls(**values, extra_args=tuple(extra))


#: Launch-only field → flag taking a value, and how to read the value back.
VALUE_FLAGS: tuple[tuple[str, str, Callable[[str], Any]], ...] = (
    ("fit", "--fit", str),
    ("spec_type", "--spec-type", str),
    ("drafter", "--spec-draft-model", Path),
    ("mmproj", "--mmproj", Path),
    ("n_cpu_moe", "--n-cpu-moe", int),
    ("n_cpu_ffn", "--n-cpu-ffn", int),
    ("threads", "--threads", int),
    ("tensor_split", "--tensor-split", str),
    ("rpc", "--rpc", str),
    # After --rpc: llama-server looks a --device name up as it parses it, and the RPC
    # devices exist only once --rpc has registered them.
    ("device", "--device", str),
)
#: Launch-only field → flag that is present or absent.
SWITCH_FLAGS: tuple[tuple[str, str], ...] = (
    ("cpu_moe", "--cpu-moe"),
    ("no_mmproj_offload", "--no-mmproj-offload"),
    ("metrics", "--metrics"),
)


def _setting_args(spec: LaunchSpec) -> Iterator[str]:
    for field in SETTING_FIELDS:
        value = getattr(spec, field.name)
        if value is None:
            continue
        if field.kind is FieldKind.BOOL:
            yield field.flag if value else str(field.negative_flag)
        else:
            yield field.flag
            yield str(value)


_CONVERTERS: dict[FieldKind, Callable[[str], Any]] = {FieldKind.INT: int,
                                                      FieldKind.FLOAT: float}

_BY_FLAG: dict[str, tuple[str, Callable[[str], Any]]] = {
    "--model": ("model", Path),
    "--log-verbosity": ("log_verbosity", int),
    **{f.flag: (f.name, _CONVERTERS.get(f.kind, str)) for f in SETTING_FIELDS
       if f.kind is not FieldKind.BOOL},
    **{flag: (name, convert) for name, flag, convert in VALUE_FLAGS},
}
_SWITCH_BY_FLAG: dict[str, tuple[str, bool]] = {
    **{flag: (name, True) for name, flag in SWITCH_FLAGS},
    **{f.flag: (f.name, True) for f in SETTING_FIELDS if f.kind is FieldKind.BOOL},
    **{str(f.negative_flag): (f.name, False) for f in SETTING_FIELDS
       if f.kind is FieldKind.BOOL},
}


def emitted_flags() -> tuple[str, ...]:
    """Every flag ``to_argv`` can produce, for checking against a build's ``--help``."""
    return ("--host", "--port", *_BY_FLAG, *_SWITCH_BY_FLAG)


def field_of_flag(flag: str) -> str | None:
    """The ``LaunchSpec`` field ``flag`` sets, None for a flag no field writes."""
    if flag in _BY_FLAG:
        return _BY_FLAG[flag][0]
    return _SWITCH_BY_FLAG[flag][0] if flag in _SWITCH_BY_FLAG else None
