"""What one harness run leaves behind: hardware, build, test outcomes and figures.

These are plain values with a JSON form (``run.json``). The plugin writes them, the
store keeps them, ``harness compare`` and the results service read them back.
"""

from __future__ import annotations

import enum
import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from harness.errors import HarnessError

RUN_SCHEMA_VERSION = 1


class Direction(enum.Enum):
    """Which way a figure gets worse."""

    HIGHER_IS_BETTER = "higher-is-better"
    LOWER_IS_BETTER = "lower-is-better"


@dataclass(frozen=True)
class Metric:
    name: str
    unit: str
    direction: Direction
    description: str
    #: The smallest absolute change that can count, in ``unit``: below it a move is the
    #: clock's or the allocator's grain, however many stdevs it spans (a 3 ms time to
    #: first token moving by 1 ms is 33 % and can be "z > 3" on a quiet baseline).
    min_change: float = 0.0


#: Every figure the harness records, by name.
METRICS: dict[str, Metric] = {m.name: m for m in (
    Metric("load_s", "s", Direction.LOWER_IS_BETTER,
           "start of the process to the server answering a completion", min_change=0.05),
    Metric("ttft_ms", "ms", Direction.LOWER_IS_BETTER,
           "time to first token of a streamed completion, measured by the client",
           min_change=5.0),
    Metric("prompt_tps", "tokens/s", Direction.HIGHER_IS_BETTER,
           "prompt processing speed from the server's timings"),
    Metric("decode_tps", "tokens/s", Direction.HIGHER_IS_BETTER,
           "generation speed from the server's timings"),
    Metric("kv_mib", "MiB", Direction.LOWER_IS_BETTER,
           "KV cache size from the server's llama_kv_cache lines"),
    Metric("peak_host_mib", "MiB", Direction.LOWER_IS_BETTER,
           "peak resident memory of the server process (VmHWM)", min_change=1.0),
    Metric("peak_vram_mib", "MiB", Direction.LOWER_IS_BETTER,
           "peak GPU memory of the server process (NVML or AMD SMI)", min_change=16.0),
)}


def metric_direction(metric: str, what: str = "figure") -> Direction:
    """Which way ``metric`` gets worse; an unknown one is an error naming ``what`` it is."""
    known = METRICS.get(metric)
    if known is None:
        raise HarnessError(f"{what} metric {metric!r} is not one the harness defines "
                           f"({', '.join(sorted(METRICS))}); add it to METRICS in "
                           "harness/results/run_record.py with its direction")
    return known.direction


def metric_unit(metric: str) -> str:
    """The unit ``metric`` is measured in; empty for a metric the harness does not define."""
    known = METRICS.get(metric)
    return known.unit if known else ""


#: What ``Hardware.gpu`` (and the figure keys' ``gpu``) holds on a runner without a GPU.
NO_GPU = "none"


@dataclass(frozen=True)
class Hardware:
    """Where a run ran. ``identity`` is what comparisons must agree on."""

    host: str
    cpu: str
    gpu: str = NO_GPU
    gpu_driver: str | None = None
    vram_mib: int | None = None

    @property
    def has_gpu(self) -> bool:
        return bool(self.gpu) and self.gpu != NO_GPU

    @property
    def identity(self) -> str:
        """Hardware that must match for figures to be comparable (not the host name)."""
        return f"{self.gpu} | {self.cpu}"

    def describe(self) -> str:
        gpu = self.gpu if self.has_gpu else "no GPU"
        extra = []
        if self.vram_mib is not None:
            extra.append(f"{self.vram_mib} MiB")
        if self.gpu_driver:
            extra.append(f"driver {self.gpu_driver}")
        detail = f" ({', '.join(extra)})" if extra else ""
        return f"{gpu}{detail} on {self.cpu}, host {self.host}"


@dataclass(frozen=True)
class BuildRef:
    """The llama-server build a run tested."""

    backend: str
    version: str
    source_digest: str
    build_key: str
    image_digest: str | None = None


@dataclass(frozen=True)
class FigureKey:
    """Launch properties a figure depends on (compare-llama-bench's kind of key set).

    Hardware is the run's; build is what a comparison varies, so neither is in here.
    """

    fixture: str
    backend: str
    gpu: str
    n_gpu_layers: str
    cache_type_k: str
    cache_type_v: str
    flash_attn: str
    offload: str
    n_prompt: int
    n_gen: int

    def label(self) -> str:
        parts = [self.fixture, self.backend, f"ngl={self.n_gpu_layers}",
                 f"K={self.cache_type_k}", f"V={self.cache_type_v}", f"fa={self.flash_attn}"]
        if self.offload:
            parts.append(self.offload)
        parts.append(f"pp{self.n_prompt}/tg{self.n_gen}")
        return " ".join(parts)


@dataclass(frozen=True)
class Figure:
    test_id: str
    key: FigureKey
    metric: str
    value: float
    #: What the bandwidth model predicted (harness/planning/decode_speed.py), for
    #: ``decode_tps`` only; never judged by a gate. None: no prediction.
    predicted: float | None = None

    @property
    def ratio(self) -> float | None:
        """Measured over predicted (above 1: faster than the model says)."""
        return None if not self.predicted else self.value / self.predicted


def _figure_json(figure: Figure) -> dict[str, Any]:
    body = asdict(figure)
    if figure.predicted is None:
        del body["predicted"]
    else:
        body["ratio"] = round(figure.value / figure.predicted, 6)
    return body


class Outcome(enum.StrEnum):
    """How one test ended: pytest's words, as its terminal summary counts them.

    ``passed``, ``failed`` and ``skipped`` are a ``TestReport.outcome``; ``error`` (a
    failing set-up or tear-down), ``xfailed`` and ``xpassed`` are the summary's names for
    the reports it tells apart (harness/plugin/recording/outcomes.py folds a test's reports into
    one). Stored in run.json, whose schema's enum is built from this class; a known flake
    is ``xfailed`` (harness/plugin/recording/flakes_plugin.py).
    """

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"
    XPASSED = "xpassed"


@dataclass(frozen=True)
class TestOutcome:
    test_id: str
    outcome: Outcome
    duration_s: float = 0.0
    message: str | None = None


FAILING_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ERROR})


@dataclass(frozen=True)
class RunRecord:
    run_id: str
    branch: str
    commit: str
    started_at: str
    finished_at: str
    hardware: Hardware
    build: BuildRef
    harness_version: str
    outcomes: tuple[TestOutcome, ...] = ()
    figures: tuple[Figure, ...] = ()
    labels: dict[str, str] = field(default_factory=dict)
    #: The paired A/B comparison ``harness ab --record`` added (harness/ab/report.py's
    #: record_json: design, threshold, per metric verdict, pairs, ratio and its CI, and
    #: the deterministic counters that changed), or None. Plain JSON, as the schema's
    #: ``ab`` property describes it.
    ab: dict[str, Any] | None = None
    #: The bisect ``harness bisect --record`` added (harness/bisect/bisector.py's
    #: record_json: endpoints, oracle, the first bad commit or the candidates, and every
    #: probe with its verdict and evidence), or None. Plain JSON, as the schema's
    #: ``bisect`` property describes it.
    bisect: dict[str, Any] | None = None
    #: The tune of the card's plan ``harness tune --record`` added (harness/tune/
    #: tune_record.py's record_json: the card, whether it is stale, the winner and every
    #: candidate's figures), or None. Plain JSON, as the schema's ``tune`` describes it.
    tune: dict[str, Any] | None = None
    #: The numerics suite's fingerprints (harness/numerics/fingerprint.py's as_json: the
    #: greedy tokens and each position's top log-probabilities), by test id, or None.
    #: ``harness compare`` holds a run's to its baseline's.
    numerics: dict[str, dict[str, Any]] | None = None

    def to_json(self) -> dict[str, Any]:
        body = asdict(self)
        # Plain text, not the enum: the schema's quick check (schema_quick_check.py) takes
        # JSON's exact types, and a subclass would send every check the slow way.
        # (What is not an Outcome is left for check_run to name.)
        body["outcomes"] = tuple({**o, "outcome": _plain(o["outcome"])}
                                 for o in body["outcomes"])
        # Left out rather than null: a run without an A/B result keeps the run.json it
        # had before the field existed, byte for byte.
        if self.ab is None:
            del body["ab"]
        if self.bisect is None:
            del body["bisect"]
        if self.tune is None:
            del body["tune"]
        if self.numerics is None:
            del body["numerics"]
        # The same for a figure without a prediction; one with a prediction adds its ratio.
        body["figures"] = tuple(_figure_json(f) for f in self.figures)
        body["schema"] = RUN_SCHEMA_VERSION
        return body


def _plain(value: object) -> object:
    """An enum member's value (an exact str for a StrEnum); anything else as it is."""
    return value.value if isinstance(value, enum.Enum) else value


def figure_medians(run: RunRecord) -> dict[tuple[FigureKey, str], tuple[float, float | None]]:
    """Per (key, metric): the median of the samples, and of their predictions (None when
    no sample has one)."""
    samples: dict[tuple[FigureKey, str], list[tuple[float, float | None]]] = {}
    for figure in run.figures:
        samples.setdefault((figure.key, figure.metric), []).append(
            (figure.value, figure.predicted))
    found = {}
    for fid, pairs in samples.items():
        guesses = [p for _, p in pairs if p is not None]
        found[fid] = (statistics.median(v for v, _ in pairs),
                      statistics.median(guesses) if guesses else None)
    return found
