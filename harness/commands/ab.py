"""``harness ab``: is the candidate build slower than the baseline, measured side by side?

Exit 0 when every metric is decided (unchanged or improved; a settled ``unknown``, a
change under the metric's floor that more pairs would not judge, counts as decided) and
the numbers did not change; 1 when a metric regressed or the candidate's greedy
log-probabilities left the same-build band (``harness/numerics/fingerprint.py``); 2 on
an error (a build that cannot be found, a server that does not start); 3 when nothing
regressed but a metric is still ``unknown`` (undecided: the interval straddles an edge
of the band when the budget runs out, or an unvalidated design's "unchanged"), so an
undecided comparison is never read as a pass. The table's last lines then say, per
undecided metric, its interval, the edge it straddles and what would decide it
(harness/ab/undecided.py).
``--calibrate-design`` instead measures a known slowdown with every design and records
which ones this runner can trust (harness/ab/design_check.py).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click
from docker.errors import DockerException

from harness import modelgen
from harness.ab.covariate import COVARIATES
from harness.ab.decision import AB_EXTEND_S, AbRule
from harness.ab.design import DESIGNS, SEQUENTIAL
from harness.ab.design_check import (
    CALIBRATING_KINDS,
    DEFAULT_SLOWDOWN,
    calibrate_designs,
    load_validation,
    validation_path,
)
from harness.ab.first_token import LONGEST_PROMPT
from harness.ab.report import outcome_json, record_json, table, undecided
from harness.ab.runner import AB_METRICS, AbOutcome, AbProgress, AbSettings, Arm, run_ab
from harness.ab.sampling import LONGEST_GEN, PROBE_REPETITIONS
from harness.ab.validation import DesignCheck, auto_design, record_for, validated_metrics
from harness.builds.under_test import resolve_named_build
from harness.errors import ConfigError, HarnessError
from harness.paths import cache_root
from harness.perf.keys import DEFAULT_PROMPT_TOKENS
from harness.probes.docker_engine import docker_engine, engine_unavailable
from harness.results.rules import AB_COVARIATE, AB_GEN_TOKENS, AB_PIN_CLIENT, AB_WARMUP
from harness.results.run_validation import add_to_run

DEFAULT_RULE = AbRule()
#: The exit statuses (the gate's A/B step reads 3 by its HARNESS_GATE_AB_UNDECIDED).
EXIT_DECIDED, EXIT_FAILED, EXIT_ERROR, EXIT_UNDECIDED = 0, 1, 2, 3
AUTO = "auto"
#: ``--ttft-prompt``'s default: sized by a probe start.
AUTO_PROMPT = "auto"


def resolve_arm(name: str, option: str) -> Arm:
    """A build key, ``build.json`` or binary; a container build or an image name: its image."""
    try:
        build = resolve_named_build(name, cache_root(), option=option)
    except HarnessError as exc:
        if _is_image(name):
            return Arm(label=option.strip("-"), image=name)
        raise ConfigError(f"{exc}; or name a Docker image the engine has") from exc
    image = build.info.image if build.info is not None else None
    if not build.binary.is_file() and image:
        return Arm(label=option.strip("-"), image=image, backend=build.backend)
    return Arm(label=option.strip("-"), binary=build.binary, backend=build.backend)


def _ttft_prompt(_ctx: click.Context, _param: click.Parameter, value: str) -> int | None:
    """``--ttft-prompt``: None for auto, else a token count the prompt may have."""
    if value == AUTO_PROMPT:
        return None
    try:
        tokens = int(value)
    except ValueError:
        tokens = 0
    if not 1 <= tokens <= LONGEST_PROMPT:
        raise click.BadParameter(f"{value!r}: give {AUTO_PROMPT} or a token count from 1 "
                                 f"to {LONGEST_PROMPT}", param_hint="--ttft-prompt")
    return tokens


def _count_or_auto(option: str, lowest: int, highest: int) -> Callable[
        [click.Context, click.Parameter, str], int | None]:
    """A callback reading ``auto`` (None: sized by the probe start) or a count from
    ``lowest`` to ``highest``."""
    def read(_ctx: click.Context, _param: click.Parameter, value: str) -> int | None:
        if value == AUTO:
            return None
        try:
            count = int(value)
        except ValueError:
            count = -1
        if not lowest <= count <= highest:
            raise click.BadParameter(f"{value!r}: give {AUTO} or a count from {lowest} to "
                                     f"{highest}", param_hint=option)
        return count
    return read


def _auto_default(value: int | None) -> str:
    return AUTO if value is None else str(value)


def _is_image(name: str) -> bool:
    if engine_unavailable() is not None:
        return False
    client = docker_engine()
    try:
        client.images.get(name)
    except DockerException:
        return False
    finally:
        client.close()
    return True


def exit_status(outcome: AbOutcome) -> int:
    """1: regressed or the numbers changed; 3: undecided; 0: decided, no regression."""
    if outcome.failed:
        return EXIT_FAILED
    return EXIT_UNDECIDED if undecided(outcome) else EXIT_DECIDED


def record_result(outcome: AbOutcome, run_json: Path) -> None:
    """Add the result to ``run_json`` as its ``ab``, saying so when it replaces one: the
    gate's rerun of an undecided comparison records its second result over the first."""
    replaced = add_to_run(run_json, "ab", record_json(outcome), what="its A/B result")
    if replaced is not None:
        click.echo(f"replaced the A/B result already in {run_json} with this one", err=True)


def _progress(progress: AbProgress) -> None:
    verdicts = ", ".join(f"{metric} {decision.verdict} ({decision.pairs} pairs)"
                         for metric, decision in progress.decisions.items())
    click.echo(f"block {progress.blocks}: {progress.elapsed_s:.0f} s: {verdicts}", err=True)


@click.command("ab")
@click.option("--baseline", default=None,
              help="The build to compare against: a build key, build.json, binary or image.")
@click.option("--candidate", default=None, help="The build under test (same forms).")
@click.option("--fixture", default="bench", show_default=True,
              help="The fixture model both arms serve, or a large fixture (bench-large, "
              "written on first use).")
@click.option("--metric", "metrics", multiple=True, type=click.Choice(AB_METRICS),
              help="A metric to decide (repeatable) [default: all four].")
@click.option("--threshold", type=click.FloatRange(0.001, 0.5),
              default=DEFAULT_RULE.threshold, show_default=True,
              help="The relative change that counts (0.03 is 3 %).")
@click.option("--budget-s", type=click.FloatRange(min=1), default=DEFAULT_RULE.budget_s,
              show_default=True, help="Seconds of measuring before what is undecided stays "
              "unknown (exit 3).")
@click.option("--extend-s", type=click.FloatRange(min=0), default=AB_EXTEND_S,
              show_default=True, help="Seconds past the budget measuring may go on while a "
              "metric's interval lies wholly beyond no change but straddles the threshold "
              "(0: stop at the budget).")
@click.option("--design", type=click.Choice((AUTO, *DESIGNS)), default=AUTO,
              show_default=True, help="sequential: each start alone, both arms on the same "
              "half of the cores (the ground truth); interleaved: ABBA blocks on all cores; "
              "duet: both arms at once, each on half the cores; alternating: both "
              "servers of a pair on one half, their requests in turns; auto: the fastest design "
              "this runner's calibration validated for every metric asked, else "
              "sequential (interleaved when an arm is an image). See docs/ab.md.")
@click.option("--calibrate-design", is_flag=True,
              help="Instead of comparing: inject a known slowdown of each --metric that "
              "has one (decode_tps, prompt_tps, ttft_ms; the slowed build against the "
              "pinned one), measure it with every design and record which keep its size "
              "within 20 % of the sequential design's.")
@click.option("--slowdown", type=click.FloatRange(0.01, 0.5), default=DEFAULT_SLOWDOWN,
              show_default=True, help="--calibrate-design: the injected decode slowdown.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="--threads of every server [default: all cores; duet and sequential: "
                   "half].")
@click.option("--n-prompt", type=click.IntRange(1, 2048), default=DEFAULT_PROMPT_TOKENS,
              show_default=True, help="Prompt tokens of the timed completions (prompt "
              "and decode speed).")
@click.option("--ttft-prompt", default=AUTO_PROMPT, show_default=True,
              callback=_ttft_prompt,
              help="Prompt tokens of the first-token requests, or auto: long enough that "
              "ttft_ms's 5 ms floor is small beside the first token, sized by one probe "
              "start of the baseline (the context grows to hold it). See docs/ab.md.")
@click.option("--gen-tokens", default=_auto_default(AB_GEN_TOKENS), show_default=True,
              callback=_count_or_auto("--gen-tokens", 1, LONGEST_GEN),
              help="Decode tokens per timed completion, or auto: doubled from 64 until a "
              "start's decode figure varies by at most a quarter of the threshold, from "
              f"the spread of {PROBE_REPETITIONS} completions of a probe start. See "
              "docs/ab.md.")
@click.option("--warmup", default=_auto_default(AB_WARMUP), show_default=True,
              callback=_count_or_auto("--warmup", 0, PROBE_REPETITIONS),
              help="Completions each start runs before its timed ones and does not count, "
              "or auto: as many as the probe start's series shows to be warm-up (MSER).")
@click.option("--pin-client/--no-pin-client", default=AB_PIN_CLIENT, show_default=True,
              help="Sequential design: pin this process to the other half of the cores "
              "while a server is measured on its half.")
@click.option("--covariate", type=click.Choice(COVARIATES), default=AB_COVARIATE,
              show_default=True, help="slot: take out of each interval the part the "
              "pair's coin-flipped slot (which arm ran first, or had the first half of "
              "the cores) explains, CUPED-style; none: the raw pairs.")
@click.option("--seed", type=int, default=None, help="Seed of the block order (printed).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the whole result as JSON (every sample, in order) instead.")
@click.option("--record", "run_json", type=click.Path(path_type=Path, dir_okay=False,
                                                      exists=True),
              default=None, help="Add the result to this run.json as its `ab` object, "
              "replacing one already there (said on stderr).")
@click.option("--allure-results", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Add the comparison to this allure-results folder: one "
              "result with the verdicts, the per-sample table and a plot.")
@click.option("--log-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Keep every server's log here [default: a temporary folder].")
def ab_command(*, baseline: str | None, candidate: str | None, fixture: str,
               metrics: tuple[str, ...], threshold: float, budget_s: float,
               extend_s: float, design: str,
               calibrate_design: bool, slowdown: float, threads: int | None,
               n_prompt: int, ttft_prompt: int | None, gen_tokens: int | None,
               warmup: int | None, pin_client: bool, covariate: str,
               seed: int | None, as_json: bool,
               run_json: Path | None, allure_results: Path | None, log_dir: Path | None) -> None:
    """Measure two builds side by side, paired, and decide per metric.

    Regressed when the whole 95 % interval of the candidate/baseline ratio is worse
    than the threshold, improved when better, unchanged when it lies within it and the
    design is validated on this runner for the metric (the sequential design always
    is), unknown otherwise or when the budget runs out first.

    Exit 0: every metric decided, none regressed; 1: a metric regressed or the numbers
    changed; 2: an error; 3: undecided, nothing regressed but a metric still unknown
    (the table's last lines say what would decide it).
    """
    try:
        if calibrate_design:
            _calibrate(fixture, metrics, slowdown=slowdown, budget_s=budget_s, seed=seed,
                       log_dir=log_dir)
            return
        if baseline is None or candidate is None:
            raise click.UsageError("--baseline and --candidate are required (or "
                                   "--calibrate-design)")
        arms = resolve_arm(baseline, "--baseline"), resolve_arm(candidate, "--candidate")
        chosen = metrics or AB_METRICS
        record = record_for(load_validation(cache_root()), [arm.backend for arm in arms])
        if design == AUTO:
            design = auto_design(chosen, record, all(a.binary is not None for a in arms))
        model = modelgen.fixture_model(fixture)
        settings = AbSettings(
            model=model, fixture=fixture, metrics=chosen,
            rule=AbRule(threshold=threshold, budget_s=budget_s, extend_s=extend_s),
            design=design,
            threads=threads, n_prompt=n_prompt, ttft_prompt=ttft_prompt, seed=seed,
            n_gen=gen_tokens, warmup=warmup, pin_client=pin_client, covariate=covariate,
            validated=validated_metrics(design, chosen, record))
        outcome = run_ab(*arms, settings, on_block=_progress, log_dir=log_dir)
        if run_json is not None:
            record_result(outcome, run_json)
        if allure_results is not None:
            # Imported here: matplotlib is slow to import, and only this needs it.
            from harness.ab.allure_result import write_allure_result  # noqa: PLC0415

            write_allure_result(outcome, allure_results)
    except HarnessError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_ERROR)
    if as_json:
        click.echo(json.dumps(outcome_json(outcome), indent=2))
    else:
        click.echo(table(outcome))
    sys.exit(exit_status(outcome))


def _calibrate(fixture: str, metrics: tuple[str, ...], *, slowdown: float, budget_s: float,
               seed: int | None, log_dir: Path | None) -> None:
    def said(design: str, check: DesignCheck) -> None:
        verdict = "keeps it" if check.keeps or design == SEQUENTIAL else "does NOT keep it"
        click.echo(f"{check.metric:10}  {design:11}  measured {check.design_effect:+.1%} "
                   f"worse over {check.pairs} pairs, {check.share:.0%} of the solo effect: "
                   f"{verdict}", err=True)

    chosen = metrics or tuple(CALIBRATING_KINDS)
    model = modelgen.fixture_model(fixture)
    click.echo(f"calibrating the A/B designs on this runner: {', '.join(chosen)} made "
               f"{slowdown:.0%} worse, {fixture} fixture "
               f"(record: {validation_path(cache_root())})", err=True)
    done = calibrate_designs(cache_root(), model, fixture, slowdown=slowdown,
                             budget_s=budget_s, metrics=chosen, seed=seed, on_design=said,
                             log_dir=log_dir)
    for metric in chosen:
        trusted = [d for d in DESIGNS
                   if metric in validated_metrics(d, (metric,), done.record)]
        click.echo(f"{metric}: injected {done.amounts[metric]} "
                   f"({CALIBRATING_KINDS[metric]}); validated: {', '.join(trusted)}")
    click.echo(f"recorded in {done.path}")
