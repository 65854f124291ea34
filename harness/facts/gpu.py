"""GPU facts and per-card tuning data: the detected GPU, a card's config, server settings.

``GpuInfo`` is what a probe reports about the device a server will run on. ``GpuConfig``
is one validated ``configs/gpu/<card>.json``; ``ServerSettings`` is the set of
llama-server options autotune decides, one field per llama-server long option
(``SETTING_FIELDS`` names the option and the values each field may take).
``ForkKvType`` is one entry of ``configs/gpu/kv_types.json``: a KV cache type that only a
fork of llama.cpp knows, with the block figures a KV sizer needs.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from types import MappingProxyType
from typing import Any

from harness.facts.build import Backend


class Vendor(enum.StrEnum):
    """Who makes the card; values are the ``vendor`` words in the GPU configs."""

    NVIDIA = "nvidia"
    AMD = "amd"
    INTEL = "intel"


class FlashAttn(enum.StrEnum):
    """``--flash-attn`` values (common/arg.cpp of the pinned source: on, off, auto)."""

    ON = "on"
    OFF = "off"
    AUTO = "auto"


class SplitMode(enum.StrEnum):
    """``--split-mode`` values (common/arg.cpp of the pinned source)."""

    NONE = "none"
    LAYER = "layer"
    ROW = "row"
    TENSOR = "tensor"


class LoadMode(enum.StrEnum):
    """``--load-mode`` values (common/arg.cpp of the pinned source).

    The pinned server folds the old ``--mlock`` / ``--no-mmap`` switches into this one
    option; the references' ``mlock: true, no_mmap: false`` is ``mmap+mlock``.
    """

    AUTO = "auto"
    NONE = "none"
    MMAP = "mmap"
    MLOCK = "mlock"
    MMAP_MLOCK = "mmap+mlock"
    DIO = "dio"


class LazyMode(enum.StrEnum):
    """``--lazy-mode`` (common/arg.cpp of the pinned source): which of the tensors the
    loader marks for lazy reading (per-layer embeddings) are read from the file on demand
    instead of kept resident. ``auto``, the default, takes those over 4 GiB."""

    ON = "on"
    AUTO = "auto"
    OFF = "off"


class DraftSampling(enum.StrEnum):
    """``--spec-draft-sampling`` (common/arg.cpp of the pinned source): greedy takes the
    draft's argmax (llama.cpp's default), probabilistic samples it and has the target
    verify by rejection sampling."""

    GREEDY = "greedy"
    PROBABILISTIC = "probabilistic"


#: KV cache types a stock llama-server accepts for ``-ctk``/``-ctv``: ``kv_cache_types``
#: in common/arg.cpp of the pinned source.
STOCK_CACHE_TYPES: tuple[str, ...] = (
    "f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1",
)

#: KV cache types only the fork builds know. configs/gpu/kv_types.json holds their block
#: figures; a test keeps this tuple, that file and the GPU schema's enum in step.
FORK_CACHE_TYPES: tuple[str, ...] = ("qjl1_256", "q4_polar", "tbq3_0", "tbq4_0")

CACHE_TYPES: tuple[str, ...] = STOCK_CACHE_TYPES + FORK_CACHE_TYPES


class FieldKind(enum.StrEnum):
    INT = "int"
    FLOAT = "float"
    BOOL = "bool"
    CHOICE = "choice"


@dataclass(frozen=True)
class SettingField:
    """One ``ServerSettings`` field: the llama-server option it stands for and its domain.

    ``flag`` is the long option; a ``BOOL`` field is the option pair ``flag`` /
    ``negative_flag``. Bounds are inclusive. The JSON schema (configs/gpu/schema.json)
    states the same domains; a test checks they agree.
    """

    name: str
    flag: str
    kind: FieldKind
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[str, ...] = ()
    multiple_of: int | None = None
    negative_flag: str | None = None

    def allowed(self) -> str:
        """The domain in words, for error messages."""
        if self.kind is FieldKind.BOOL:
            return "a boolean (true/false, 1/0, on/off, yes/no)"
        if self.kind is FieldKind.CHOICE:
            return "one of " + ", ".join(self.choices)
        text = "an integer" if self.kind is FieldKind.INT else "a number"
        low, high = self.minimum, self.maximum
        if low is not None and high is not None:
            text += f" from {_num(low)} to {_num(high)}"
        elif low is not None:
            text += f" >= {_num(low)}"
        elif high is not None:
            text += f" <= {_num(high)}"
        if self.multiple_of is not None:
            text += f", a multiple of {self.multiple_of}"
        return text


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


#: The documented set of settings, in argv order. Names are the llama-server long
#: option without dashes, dashes as underscores (``--ctx-size`` -> ``ctx_size``).
SETTING_FIELDS: tuple[SettingField, ...] = (
    # 999 = every layer (reference 001, docs/references.md: unambiguous, survives clamping).
    SettingField("n_gpu_layers", "--n-gpu-layers", FieldKind.INT, minimum=0),
    # Any context is accepted: llama.cpp pads n_ctx (and each slot's share) up to a
    # multiple of 256 (src/llama-context.cpp), which the KV planner models and the plan
    # warns about; 0 is the model's training context.
    SettingField("ctx_size", "--ctx-size", FieldKind.INT, minimum=0, maximum=4194304),
    SettingField("parallel", "--parallel", FieldKind.INT, minimum=1, maximum=256),
    SettingField("batch_size", "--batch-size", FieldKind.INT, minimum=1, maximum=65536),
    SettingField("ubatch_size", "--ubatch-size", FieldKind.INT, minimum=1, maximum=65536),
    SettingField("cache_type_k", "--cache-type-k", FieldKind.CHOICE, choices=CACHE_TYPES),
    SettingField("cache_type_v", "--cache-type-v", FieldKind.CHOICE, choices=CACHE_TYPES),
    SettingField("flash_attn", "--flash-attn", FieldKind.CHOICE,
                 choices=tuple(m.value for m in FlashAttn)),
    SettingField("split_mode", "--split-mode", FieldKind.CHOICE,
                 choices=tuple(m.value for m in SplitMode)),
    SettingField("main_gpu", "--main-gpu", FieldKind.INT, minimum=0),
    SettingField("kv_offload", "--kv-offload", FieldKind.BOOL,
                 negative_flag="--no-kv-offload"),
    SettingField("load_mode", "--load-mode", FieldKind.CHOICE,
                 choices=tuple(m.value for m in LoadMode)),
    SettingField("ctx_checkpoints", "--ctx-checkpoints", FieldKind.INT, minimum=0),
    # The references' ctx_checkpoint_interval; the pinned server names it this.
    SettingField("checkpoint_min_step", "--checkpoint-min-step", FieldKind.INT, minimum=0),
    SettingField("spec_draft_n_min", "--spec-draft-n-min", FieldKind.INT, minimum=0),
    SettingField("spec_draft_n_max", "--spec-draft-n-max", FieldKind.INT, minimum=0),
    SettingField("spec_draft_p_min", "--spec-draft-p-min", FieldKind.FLOAT, minimum=0.0,
                 maximum=1.0),
    SettingField("spec_draft_sampling", "--spec-draft-sampling", FieldKind.CHOICE,
                 choices=tuple(m.value for m in DraftSampling)),
    SettingField("lazy_mode", "--lazy-mode", FieldKind.CHOICE,
                 choices=tuple(m.value for m in LazyMode)),
)
#: Settings a card may leave to the server's default (every other one it must set):
#: added after the cards were written, and a card that sets one asks every build for
#: the option (``harness.planning.draft_sampling``, ``harness.planning.lazy_tensors``).
OPTIONAL_CARD_SETTINGS: frozenset[str] = frozenset({"spec_draft_sampling", "lazy_mode"})
#: The settings a card's ``spec_by_backend`` entries may set (reference 002's
#: ``spec.byBackend``: draft sizes and sampling; the type is ``spec_type``).
SPECULATIVE_SETTINGS: tuple[str, ...] = ("spec_draft_n_min", "spec_draft_n_max",
                                         "spec_draft_p_min", "spec_draft_sampling")

SETTING_NAMES: tuple[str, ...] = tuple(f.name for f in SETTING_FIELDS)
SETTINGS_BY_NAME: Mapping[str, SettingField] = MappingProxyType(
    {f.name: f for f in SETTING_FIELDS}
)

SettingValue = int | float | bool | str

_ENUM_FIELDS: Mapping[str, type[enum.StrEnum]] = MappingProxyType(
    {"flash_attn": FlashAttn, "split_mode": SplitMode, "load_mode": LoadMode,
     "spec_draft_sampling": DraftSampling, "lazy_mode": LazyMode}
)


@dataclass(frozen=True)
class ServerSettings:
    """llama-server options; ``None`` leaves an option to the server (or the catalog).

    ``ctx_size`` is llama-server's ``--ctx-size``: the whole KV pool the ``parallel``
    slots share (each slot gets ``ctx_size / parallel`` unless the KV is unified).
    """

    n_gpu_layers: int | None = None
    ctx_size: int | None = None
    parallel: int | None = None
    batch_size: int | None = None
    ubatch_size: int | None = None
    cache_type_k: str | None = None
    cache_type_v: str | None = None
    flash_attn: FlashAttn | None = None
    split_mode: SplitMode | None = None
    main_gpu: int | None = None
    kv_offload: bool | None = None
    load_mode: LoadMode | None = None
    ctx_checkpoints: int | None = None
    checkpoint_min_step: int | None = None
    spec_draft_n_min: int | None = None
    spec_draft_n_max: int | None = None
    spec_draft_p_min: float | None = None
    spec_draft_sampling: DraftSampling | None = None
    lazy_mode: LazyMode | None = None

    def items(self) -> Iterator[tuple[str, SettingValue]]:
        """The set fields, in ``SETTING_FIELDS`` order."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                yield f.name, value

    def as_dict(self) -> dict[str, SettingValue]:
        return dict(self.items())

    @classmethod
    def from_values(cls, values: Mapping[str, SettingValue]) -> ServerSettings:
        """Settings from checked plain values (names in ``SETTING_NAMES``); enum fields
        become their enums."""
        converted: dict[str, Any] = {
            name: _ENUM_FIELDS[name](str(value)) if name in _ENUM_FIELDS else value
            for name, value in values.items()
        }
        return cls(**converted)

    def overlaid(self, other: ServerSettings) -> ServerSettings:
        """These settings with every field ``other`` sets taking its value."""
        changes: dict[str, Any] = dict(other.items())
        return replace(self, **changes)


@dataclass(frozen=True)
class GpuInfo:
    """A detected GPU as a probe reports it (nvidia-smi/pynvml, rocm-smi, vulkaninfo)."""

    name: str
    vram_mib: int
    #: The backend the probe reached the card through; None where no probe said (a card
    #: named on the command line). Probes parse their tool's words into it.
    backend: Backend | None = None
    driver: str | None = None


@dataclass(frozen=True)
class Supports:
    fp8: bool
    fp4: bool
    flash_attn_3: bool


@dataclass(frozen=True)
class FitCaps:
    """Upper bounds the fitting planner never exceeds on this card (reference 001)."""

    #: Most slots any recommendation uses on the card (practical session count).
    max_parallel: int
    #: Longest context one slot is given ("Max ctx (rec.)").
    max_ctx_size: int


class Provenance(enum.StrEnum):
    MEASURED = "measured"
    EXTRAPOLATED = "extrapolated"


@dataclass(frozen=True)
class ExpectedMetrics:
    ttfa_p50_ms: float
    ttfa_p95_ms: float
    rtf: float
    tokens_per_second_decode: float | None
    provenance: Provenance
    note: str | None = None


@dataclass(frozen=True)
class MeasuredDecode:
    """A card's calibrated decode speed for one bundle and figure key (``measured``)."""

    median: float
    #: The nights' interquartile range over the median.
    spread: float
    runs: int
    last: str


@dataclass(frozen=True)
class TunedSettings:
    """``harness tune --write``'s winner for one bundle (or model class) and context:
    the settings it changed, and where they were measured (``tuned``)."""

    settings: ServerSettings
    #: When (ISO 8601), on which build, and which candidate won.
    measured: str
    build_key: str
    candidate: str


@dataclass(frozen=True)
class BackendSpec:
    """A card's speculative settings for builds of one backend (``spec_by_backend``): the
    spec type (``none`` turns drafting off) and the draft settings, over the card's own."""

    spec_type: str | None = None
    settings: ServerSettings = field(default_factory=ServerSettings)


@dataclass(frozen=True)
class GpuConfig:
    """One ``configs/gpu/<name>.json``, validated."""

    name: str
    match: tuple[str, ...]
    vendor: Vendor
    backends: tuple[Backend, ...]
    vram_gib: float
    compute_capability: str | None
    gfx_target: str | None
    architecture: str
    memory_bandwidth_gbps: float
    supports: Supports
    reserved_headroom_mib: int
    fit_caps: FitCaps
    llama_server_flags: ServerSettings
    bundle_recommendations: Mapping[str, ServerSettings]
    expected_metrics: ExpectedMetrics
    known_limits: tuple[str, ...]
    description: str | None = None
    #: ``harness calibrate``'s decode figures, by (bundle, figure key label).
    measured_decode: Mapping[tuple[str, str], MeasuredDecode] = field(
        default_factory=lambda: MappingProxyType({}))
    #: ``harness tune --write``'s settings, by (bundle id, class or ``model:ARCH``,
    #: context as text: ``"32768"``, or ``"default"`` for a plan that sets none).
    tuned: Mapping[tuple[str, str], TunedSettings] = field(
        default_factory=lambda: MappingProxyType({}))
    #: Speculative settings per build backend, over the card's (reference 002).
    spec_by_backend: Mapping[Backend, BackendSpec] = field(
        default_factory=lambda: MappingProxyType({}))
    #: Where the config was read from; only for messages.
    source: str = field(default="", compare=False)

    @property
    def vram_mib(self) -> int:
        return int(self.vram_gib * 1024)


@dataclass(frozen=True)
class ForkKvType:
    """A fork-only KV cache type: ``bytes_per_block`` bytes hold ``block_size`` values."""

    name: str
    block_size: int
    bytes_per_block: int

    @property
    def bits_per_value(self) -> float:
        return self.bytes_per_block * 8 / self.block_size
