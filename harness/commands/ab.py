"""``harness ab``: is the candidate build slower than the baseline, measured side by side?

Exit 0 when no metric regressed (unchanged, improved or unknown), 1 when one did, 2 on
an error (a build that cannot be found, a server that does not start).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from docker.errors import DockerException

from harness import modelgen
from harness.ab.decision import AbRule
from harness.ab.design import DESIGNS, DUET, INTERLEAVED
from harness.ab.report import outcome_json, record_json, table
from harness.ab.runner import AB_METRICS, AbProgress, AbSettings, Arm, run_ab
from harness.builds.under_test import resolve_named_build
from harness.errors import ConfigError, HarnessError
from harness.files import write_json_atomic
from harness.paths import cache_root
from harness.probes.docker_engine import docker_engine, engine_unavailable
from harness.results.run_validation import parse_run_json

DEFAULT_RULE = AbRule()
AUTO = "auto"


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
        return Arm(label=option.strip("-"), image=image)
    return Arm(label=option.strip("-"), binary=build.binary)


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


def _progress(progress: AbProgress) -> None:
    verdicts = ", ".join(f"{metric} {decision.verdict} ({decision.pairs} pairs)"
                         for metric, decision in progress.decisions.items())
    click.echo(f"block {progress.blocks}: {progress.elapsed_s:.0f} s: {verdicts}", err=True)


def _record(run_json: Path, ab: dict[str, object]) -> None:
    """Add the ``ab`` object to an existing run record, through the run.json schema."""
    body = parse_run_json(run_json.read_bytes(), source=str(run_json)).to_json()
    body["ab"] = ab
    parse_run_json(json.dumps(body), source=f"{run_json} with its A/B result")
    write_json_atomic(run_json, body)


@click.command("ab")
@click.option("--baseline", required=True,
              help="The build to compare against: a build key, build.json, binary or image.")
@click.option("--candidate", required=True, help="The build under test (same forms).")
@click.option("--fixture", default="bench", show_default=True,
              help="The fixture model both arms serve.")
@click.option("--metric", "metrics", multiple=True, type=click.Choice(AB_METRICS),
              help="A metric to decide (repeatable) [default: all four].")
@click.option("--threshold", type=click.FloatRange(0.001, 0.5),
              default=DEFAULT_RULE.threshold, show_default=True,
              help="The relative change that counts (0.03 is 3 %).")
@click.option("--budget-s", type=click.FloatRange(min=1), default=DEFAULT_RULE.budget_s,
              show_default=True, help="Seconds of measuring before undecided is unknown.")
@click.option("--design", type=click.Choice((AUTO, *DESIGNS)), default=AUTO,
              show_default=True, help="duet: both arms at once, each on half the cores; "
              "interleaved: ABBA blocks one start after another; auto: duet for two host "
              "builds (it decides several times sooner here, see docs/ab.md), "
              "interleaved when an arm is an image.")
@click.option("--threads", type=click.IntRange(min=1), default=None,
              help="--threads of every server [default: all cores; duet: half].")
@click.option("--seed", type=int, default=None, help="Seed of the block order (printed).")
@click.option("--json", "as_json", is_flag=True,
              help="Print the whole result as JSON (every sample, in order) instead.")
@click.option("--record", "run_json", type=click.Path(path_type=Path, dir_okay=False,
                                                      exists=True),
              default=None, help="Add the result to this run.json as its `ab` object.")
@click.option("--allure-results", type=click.Path(path_type=Path, file_okay=False),
              default=None, help="Add the comparison to this allure-results folder: one "
              "result with the verdicts, the per-sample table and a plot.")
@click.option("--log-dir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Keep every server's log here [default: a temporary folder].")
def ab_command(*, baseline: str, candidate: str, fixture: str, metrics: tuple[str, ...],
               threshold: float, budget_s: float, design: str, threads: int | None,
               seed: int | None, as_json: bool, run_json: Path | None,
               allure_results: Path | None, log_dir: Path | None) -> None:
    """Measure two builds side by side, paired, and decide per metric.

    Regressed when the whole 95 % interval of the candidate/baseline ratio is worse
    than the threshold, unchanged when it lies within it, improved, or unknown when
    the budget runs out first.
    """
    try:
        arms = resolve_arm(baseline, "--baseline"), resolve_arm(candidate, "--candidate")
        if design == AUTO:
            design = DUET if all(arm.binary is not None for arm in arms) else INTERLEAVED
        model = modelgen.ensure_fixtures().model(fixture)
        settings = AbSettings(
            model=model, fixture=fixture, metrics=metrics or AB_METRICS,
            rule=AbRule(threshold=threshold, budget_s=budget_s), design=design,
            threads=threads, seed=seed)
        outcome = run_ab(*arms, settings, on_block=_progress, log_dir=log_dir)
        if run_json is not None:
            _record(run_json, record_json(outcome))
        if allure_results is not None:
            # Imported here: matplotlib is slow to import, and only this needs it.
            from harness.ab.allure_result import write_allure_result  # noqa: PLC0415

            write_allure_result(outcome, allure_results)
    except HarnessError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    if as_json:
        click.echo(json.dumps(outcome_json(outcome), indent=2))
    else:
        click.echo(table(outcome))
    sys.exit(1 if outcome.regressed else 0)
