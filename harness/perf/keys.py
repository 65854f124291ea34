"""Which launch a figure belongs to (pure): the FigureKey of a LaunchSpec."""

from __future__ import annotations

from collections.abc import Mapping

from harness.planning.launch import LaunchSpec
from harness.results.run_record import Figure, FigureKey

#: The standard measurement: a short prompt and a short generation, repeated, so that
#: measuring every server a suite starts costs tens of milliseconds on the tiny fixtures
#: while the median of the repetitions keeps one slow request from moving a figure.
DEFAULT_PROMPT_TOKENS = 32
DEFAULT_GEN_TOKENS = 64
DEFAULT_REPETITIONS = 5


def fixture_label(spec: LaunchSpec) -> str:
    """The model file's stem, with the drafter's or the speculative mode after a ``+``."""
    label = spec.model.stem
    if spec.drafter is not None:
        label += f"+{spec.drafter.stem}"
    elif spec.spec_type:
        label += f"+{spec.spec_type}"
    return label


def offload_label(spec: LaunchSpec) -> str:
    """The offload overrides in force, as flag words; empty for none."""
    words = []
    if spec.n_cpu_moe is not None:
        words.append(f"n-cpu-moe={spec.n_cpu_moe}")
    if spec.cpu_moe:
        words.append("cpu-moe")
    if spec.n_cpu_ffn is not None:
        words.append(f"n-cpu-ffn={spec.n_cpu_ffn}")
    if spec.kv_offload is False:
        words.append("no-kv-offload")
    return ",".join(words)


def figure_key(spec: LaunchSpec, *, backend: str, gpu: str, n_prompt: int,
               n_gen: int) -> FigureKey:
    """The key of every figure measured on a server started from ``spec``.

    Unset fields are the server's defaults and are keyed as such, so an explicit value
    and the default it equals stay different keys (the flags on the command line differ).
    """
    return FigureKey(
        fixture=fixture_label(spec),
        backend=backend,
        gpu=gpu,
        n_gpu_layers="default" if spec.n_gpu_layers is None else str(spec.n_gpu_layers),
        cache_type_k=spec.cache_type_k or "default",
        cache_type_v=spec.cache_type_v or "default",
        flash_attn=spec.flash_attn or "default",
        offload=offload_label(spec),
        n_prompt=n_prompt,
        n_gen=n_gen,
    )


def figures(test_id: str, key: FigureKey, values: dict[str, float],
            predicted: Mapping[str, float] | None = None) -> list[Figure]:
    """One figure per measured metric; ``predicted`` adds a prediction to its metric's."""
    guesses = predicted or {}
    return [Figure(test_id=test_id, key=key, metric=metric, value=value,
                   predicted=guesses.get(metric))
            for metric, value in sorted(values.items())]
