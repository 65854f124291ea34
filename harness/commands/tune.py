"""``harness tune``: is the card's plan still the fastest this build can run?

Plans the alternatives to the current plan (harness/tune/candidates.py), prints them
ranked by prediction, measures the best ``--top`` against the current plan with the
A/B machinery until ``--budget-s`` is spent (harness/tune/tune_measure.py), and names the
winner — or says the current plan holds (harness/tune/winner.py). ``--check`` is the
stale-card alarm (the two best alternatives; a warning, never a failure), ``--record``
adds the result to a run record (harness/tune/tune_record.py), ``--write`` puts the
winner in the card's ``tuned`` section (harness/tune/card_entry.py). Exit 0 either way;
2 on an error (no build, a bad card, a model that cannot be read).
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console

from harness.ab.decision import AbRule
from harness.ab.pinning import usable_cores
from harness.builds.resolve import pinned_cpu_build
from harness.builds.under_test import BuildUnderTest, resolve_named_build
from harness.commands._card_write import write_card_checked
from harness.commands.plan import plan_request
from harness.errors import ConfigError
from harness.facts.build import Backend, BuildInfo
from harness.paths import cache_root
from harness.planning.autotune import TuneSource
from harness.planning.decode_speed import plan_bandwidths
from harness.planning.launch_plan import plan_launch
from harness.probes.hardware import detect_hardware
from harness.probes.host_memory import host_memory
from harness.results.run_validation import add_to_run
from harness.tune.candidates import Candidate, TuneSpace, parse_dimensions, plan_candidates
from harness.tune.card_entry import not_writable, tuned_entry, tuned_key, with_tuned
from harness.tune.quality import load_kv_quality
from harness.tune.tune_measure import TUNE_METRICS, TuneRun, measure_candidates
from harness.tune.tune_record import record_json
from harness.tune.tune_table import tune_json, tune_table
from harness.tune.winner import Measured, judge

#: The measuring budget unless told: three or four candidates of a tiny model here.
DEFAULT_BUDGET_S = 600.0
DEFAULT_TOP = 4
#: ``--check`` measures the plan against this many alternatives, the best predicted.
CHECK_ALTERNATIVES = 2
#: A tune looks for a change worth a card edit: larger than the gate's 3 %.
DEFAULT_THRESHOLD = 0.05
#: Prompt tokens of the timed requests: long enough for batch and ubatch sizes to
#: matter (the A/B default of 32 is one micro-batch under any of them).
DEFAULT_TUNE_PROMPT = 512


@click.command("tune")
@click.option("--bundle", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="A fused bundle directory (manifest.json + text/).")
@click.option("--model", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A bare GGUF to tune for instead of a bundle.")
@click.option("--gpu", "gpu_name", help="The card, as its driver names it (with --vram-mib).")
@click.option("--vram-mib", type=int, help="Its total memory in MiB.")
@click.option("--configs", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Card config folder (default: the packaged configs/gpu).")
@click.option("--ctx", "ctx_size", type=int, help="The context to tune for (--ctx-size).")
@click.option("--build", "build_name", metavar="KEY|BUILD_JSON|BINARY",
              help="The build to measure (default: the cached pinned CPU build).")
@click.option("--vary", multiple=True, metavar="DIMS",
              help="Dimensions to try, comma separated: kv, batch, flash-attn, threads, "
                   "slots, drafter, offload (default: all).")
@click.option("--top", type=click.IntRange(1, 64), default=DEFAULT_TOP, show_default=True,
              help="Candidates measured, best predicted first.")
@click.option("--budget-s", type=click.FloatRange(min=1), default=DEFAULT_BUDGET_S,
              show_default=True, help="Seconds of measuring, shared by the candidates.")
@click.option("--threshold", type=click.FloatRange(0, 1, min_open=True, max_open=True),
              default=DEFAULT_THRESHOLD, show_default=True,
              help="The change that counts: a winner is faster by more, its whole interval.")
@click.option("--metric", "metrics", multiple=True, type=click.Choice(TUNE_METRICS),
              help="A figure to compare; repeatable (default: all three). One figure "
                   "decides sooner: a comparison ends when each of its figures has a "
                   "verdict.")
@click.option("--n-prompt", type=click.IntRange(1, 8192), default=DEFAULT_TUNE_PROMPT,
              show_default=True, help="Prompt tokens of each timed request.")
@click.option("--seed", type=int, help="Seed of the comparisons' orders (default: random).")
@click.option("--log-dir", type=click.Path(path_type=Path, file_okay=False),
              help="Keep every server's log here (default: a temporary folder).")
@click.option("--check", is_flag=True,
              help="The stale-card check: the plan against its two best alternatives; "
                   "a better one is reported (exit 0 still).")
@click.option("--record", "record", type=click.Path(path_type=Path, dir_okay=False,
                                                     exists=True),
              metavar="RUN_JSON", help="Add the tune to this run record as its tune object.")
@click.option("--write", is_flag=True,
              help="Write the winner into the card config's tuned section.")
@click.option("--json", "as_json", is_flag=True,
              help="Print every candidate, comparison and sample as JSON.")
def tune_command(*, bundle: Path | None, model: Path | None, gpu_name: str | None,
                 vram_mib: int | None, configs: Path | None, ctx_size: int | None,
                 build_name: str | None, vary: tuple[str, ...], top: int, budget_s: float,
                 threshold: float, metrics: tuple[str, ...], n_prompt: int,
                 seed: int | None, log_dir: Path | None,
                 check: bool, record: Path | None, write: bool, as_json: bool) -> None:
    """Measure the card's plan against its best alternatives on this build."""
    if (bundle is None) == (model is None):
        raise click.UsageError("give exactly one of --bundle PATH or --model PATH")
    if (gpu_name is None) != (vram_mib is None):
        raise click.UsageError("--gpu and --vram-mib go together")
    if check and write:
        raise click.UsageError("--check reports a stale card; it does not write one "
                               "(run without --check to --write)")
    top = CHECK_ALTERNATIVES if check else top
    try:
        dimensions = parse_dimensions(vary)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--vary") from None
    binary, info = _build(build_name)
    request = plan_request(bundle, model, gpu_name=gpu_name, vram_mib=vram_mib,
                           build=BuildUnderTest(binary, info),
                           overrides={"ctx_size": ctx_size} if ctx_size else {},
                           configs=configs)
    host = info.backend is Backend.CPU
    cores = len(usable_cores())
    space = TuneSpace(
        request=request, weights=load_kv_quality(),
        bandwidths=plan_bandwidths(plan_launch(request), request.gpu,
                                   host_memory(cache_root()).bandwidth()),
        host_cores=cores if host else None, current_threads=cores if host else None,
        dimensions=dimensions)
    current, ranked = plan_candidates(space)
    current.plan.ensure_sendable()
    out = Console(stderr=as_json, soft_wrap=True)
    if not out.is_terminal:
        out.width = 220  # a log keeps the table's rows whole
    out.print(f"[bold]tune[/] {current.plan.tune.headline}", highlight=False)
    run = TuneRun(binary=binary, backend=info.backend, fixture=request.model_path.stem,
                  budget_s=budget_s, top=top, rule=AbRule(threshold=threshold),
                  metrics=metrics or TUNE_METRICS, n_prompt=n_prompt, seed=seed,
                  image=None if binary.is_file() else info.image)

    def progress(measured: Measured) -> None:
        out.print(f"[bold]measured[/] {measured.candidate.name}: {measured.verdict} "
                  f"({measured.elapsed_s:.0f} s)", highlight=False)

    measured = _measure(current, ranked, run, log_dir, progress)
    verdict = judge(measured, threshold)
    out.print(tune_table(current, ranked, measured, run.metrics))
    out.print("[bold]verdict[/] ", end="")
    out.print(verdict.summary, highlight=False, markup=False)
    card = current.plan.tune.label or "none"
    key, ctx = tuned_key(current, request.model.architecture)
    if check:
        out.print(f"stale card: {card}'s plan for {key} at context {ctx} is beaten: "
                  f"{verdict.summary} (a warning; nothing fails)" if verdict.winner else
                  f"card {card} holds for {key} at context {ctx}", highlight=False,
                  markup=False)
    if record is not None:
        add_to_run(record, "tune", record_json(
            current, ranked, measured, verdict, card=card, key=key, context=ctx,
            build_key=info.key, check=check, threshold=threshold), what="the tune")
        out.print(f"added the tune to {record}", highlight=False, markup=False)
    written = None
    if write:
        written = _write(verdict.winner, current, request.model.architecture, info=info,
                         threshold=threshold, out=out)
    if as_json:
        meta: dict[str, Any] = {"build_key": info.key, "backend": info.backend.value,
                                "model": str(request.model_path), "threshold": threshold,
                                "budget_s": budget_s, "design": "interleaved",
                                "n_prompt": n_prompt, "gpu": gpu_name, "vram_mib": vram_mib,
                                "written": None if written is None else str(written)}
        json.dump(tune_json(current, ranked, measured, verdict, binary=str(binary),
                            meta=meta), sys.stdout, indent=2)
        sys.stdout.write("\n")


def _measure(current: Candidate, ranked: Sequence[Candidate], run: TuneRun,
             log_dir: Path | None, progress: Callable[[Measured], None]) -> list[Measured]:
    if log_dir is not None:
        log_dir.mkdir(parents=True, exist_ok=True)
        return measure_candidates(current, ranked, run, log_dir=log_dir, on_result=progress)
    with tempfile.TemporaryDirectory(prefix="harness-tune-") as temp:
        return measure_candidates(current, ranked, run, log_dir=Path(temp),
                                  on_result=progress)


def _build(name: str | None) -> tuple[Path, BuildInfo]:
    """The binary to measure and its record (a tune needs its capabilities)."""
    if name is None:
        cached = pinned_cpu_build(cache_root())
        if cached is None:
            raise ConfigError("no cached CPU build of the pinned source: run `harness build` "
                              "first, or name one with --build")
        return Path(cached.info.binary), cached.info
    build = resolve_named_build(name, cache_root(), option="--build")
    if build.info is None:
        raise ConfigError(f"--build {name}: a bare binary has no build.json, so its cache "
                          "types and flags are unknown; name its build.json or build key")
    return build.binary, build.info


def _write(winner: Measured | None, current: Candidate, architecture: str, *,
           info: BuildInfo, threshold: float, out: Console) -> Path | None:
    """The winner into its card's ``tuned`` section; the file written, or None (said)."""
    if winner is None:
        out.print("nothing written: the current plan holds")
        return None
    why = not_writable(winner)
    if why is not None:
        out.print(f"nothing written: {why}", highlight=False, markup=False)
        return None
    config = current.plan.tune.config
    if config is None or current.plan.tune.source is not TuneSource.MATCH:
        raise ConfigError("--write needs a card matched by name (--gpu): "
                          f"{current.plan.tune.headline}")
    path = Path(config.source)
    key, ctx = tuned_key(current, architecture)
    entry = tuned_entry(winner, current, build_key=info.key, hardware=detect_hardware(),
                        measured_at=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        threshold=threshold)
    write_card_checked(path, with_tuned(json.loads(path.read_text()), key, ctx, entry),
                       section="tuned", error=ConfigError)
    out.print(f"wrote {path}: tuned {key} at context {ctx} sets "
              + ", ".join(f"{k}={v}" for k, v in entry["settings"].items()),
              highlight=False, markup=False)
    return path
