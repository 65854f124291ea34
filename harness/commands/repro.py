"""``harness repro``: run one recorded failure again here, on the exact build that failed.

FAILURE is an Allure ``*-result.json`` (its folder holds the run's
``environment.properties`` and attachments), or a report URL of the results service;
``--run/--test/--service`` names a stored run's test instead. The command resolves the
build the run tested (cache, or a rebuild when its source is at hand), writes the
fixtures, prints each server's command line mapped to this machine, reruns the test with
pytest under the recorded planner GPU, and says whether it failed the same way. Exit
status: pytest's (1 when the test failed again), 2 when it cannot be reproduced as
recorded.
"""

from __future__ import annotations

import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import click

from harness import modelgen
from harness.builds.native import ProgressCallback
from harness.errors import HarnessError
from harness.facts.build import BuildInfo
from harness.facts.gpu import GpuInfo
from harness.files import write_json_atomic
from harness.paths import SUITES_NODEID_PREFIX, SUITES_ROOTDIR, cache_root
from harness.planning.container_plan import SERVER_PATH_IN_IMAGE
from harness.plugin.recording.run_file import current_commit
from harness.probes.devices import list_devices
from harness.probes.hardware import detect_hardware
from harness.repro.command import (
    LocalCommand,
    docker_command,
    fixture_index,
    for_external,
    local_command,
)
from harness.repro.fetch import fetch_failure
from harness.repro.properties import ROOTDIR, format_gpu_spec, recorded_planner_gpu
from harness.repro.recorded_build import (
    RecordedBuild,
    ensure_recorded_build,
    recorded_image,
)
from harness.repro.recorded_failure import RecordedFailure, load_result_file
from harness.repro.rerun import (
    Rerun,
    read_outcome,
    rerun_env,
    rootdir_for,
    run_streaming,
    verdict,
)
from harness.repro.target import FileTarget, parse_target


class _NotReproducible(click.ClickException):
    """What is missing to reproduce the failure (exit 2, like the harness's other errors)."""

    exit_code = 2


@click.command("repro")
@click.argument("failure", required=False)
@click.option("--run", "run_id", default=None,
              help="A run stored on the results service (with --test and --service).")
@click.option("--test", default=None,
              help="The pytest node id of the test to rerun (the result's 'nodeid' label).")
@click.option("--service", envvar="HARNESS_SERVICE_URL", default=None,
              help="The results service, e.g. http://127.0.0.1:8080 [env HARNESS_SERVICE_URL].")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=None,
              help="A llama.cpp tree to build from when the failure's source digest is not "
                   "the pinned one (it must hash to that digest).")
@click.option("--local-gpu", is_flag=True,
              help="Plan for this machine's GPU instead of the one the run planned for.")
@click.option("--external", metavar="URL", default=None,
              help="Attach the test to a llama-server you started (e.g. under a debugger) "
                   "instead of starting one.")
@click.option("--rootdir", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=None,
              help="Where to run pytest (node ids are relative to it); default for a suite "
                   "test: the folder holding this install's suites/ (a checkout's root, or "
                   "site-packages/harness); for another test the run's rootdir when it "
                   "exists here, else that folder.")
@click.option("--alluredir", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Keep the rerun's Allure results here (default: a temporary folder).")
@click.pass_context
def repro_command(ctx: click.Context, *, failure: str | None, run_id: str | None,
                  test: str | None, service: str | None, source: Path | None, local_gpu: bool,
                  external: str | None, rootdir: Path | None, alluredir: Path | None) -> None:
    """Rerun a recorded failure on its exact build; print its server command lines."""
    try:
        code = _reproduce(failure=failure, run_id=run_id, test=test, service=service,
                          source=source, local_gpu=local_gpu, external=external,
                          rootdir=rootdir, alluredir=alluredir)
    except HarnessError as exc:
        raise _NotReproducible(str(exc)) from exc
    ctx.exit(code)


def _reproduce(*, failure: str | None, run_id: str | None, test: str | None,
               service: str | None, source: Path | None, local_gpu: bool,
               external: str | None, rootdir: Path | None, alluredir: Path | None) -> int:
    target = parse_target(failure, run_id=run_id, test=test, service=service)
    recorded = (load_result_file(target.path, test) if isinstance(target, FileTarget)
                else fetch_failure(target))
    _describe(recorded)
    build = RecordedBuild.from_properties(recorded.properties, recorded.origin)
    click.echo(f"build:    {build.describe()}")
    with tempfile.TemporaryDirectory(prefix="harness-repro-") as tmp:
        work = Path(tmp)
        info, build_json = _resolve_build(build, source, work)
        fixtures = modelgen.ensure_fixtures()
        click.echo(f"fixtures: {fixtures.root}")
        missing = sorted(set(recorded.fixtures) - set(fixtures.models))
        if missing:
            click.echo(f"warning: the run loaded fixtures this checkout does not define: "
                       f"{', '.join(missing)}; check out the harness commit it ran", err=True)
        gpu = _planner_gpu(recorded, info, local_gpu)
        click.echo(f"planner GPU: {format_gpu_spec(gpu) if gpu else 'none'}"
                   f"{' (this machine)' if local_gpu else ' (as the run planned)'}")
        _print_commands(recorded, info, build, fixtures.root, external)
        # A suite test runs from wherever this install keeps the suites (its node id is
        # relative to that folder); another test from the run's own rootdir, if it is here.
        suite = recorded.nodeid.startswith(SUITES_NODEID_PREFIX)
        rerun = Rerun(nodeid=recorded.nodeid,
                      rootdir=rootdir or (SUITES_ROOTDIR if suite else rootdir_for(
                          recorded.properties.get(ROOTDIR), SUITES_ROOTDIR)),
                      build_json=build_json, alluredir=alluredir or work / "allure-results",
                      planner_gpu=gpu, external=external,
                      image=(build.image_id or build.image) if build.image else None)
        argv = rerun.argv(sys.executable)
        click.echo(f"rerun (in {rerun.rootdir}): {shlex.join(argv[2:])}")
        code = run_streaming(argv, rerun.rootdir, rerun_env(os.environ), click.echo)
        _, words = verdict(recorded, read_outcome(rerun.alluredir, recorded.nodeid))
        click.echo(f"outcome: {words}")
        if alluredir is not None:
            click.echo(f"rerun's Allure results: {rerun.alluredir}")
    return code


def _describe(recorded: RecordedFailure) -> None:
    props = recorded.properties
    click.echo(f"test:     {recorded.nodeid}")
    click.echo(f"recorded: {recorded.status}" + (f": {recorded.headline}"
                                                 if recorded.headline else ""))
    click.echo(f"from:     {recorded.origin}")
    gpu = props.get("gpu.name", "none")
    gpu = "no GPU" if gpu == "none" else f"{gpu} ({props.get('gpu.vram_mib', '?')} MiB)"
    click.echo(f"hardware: {gpu} on {props.get('host.cpu', '?')}, host {props.get('host', '?')}")
    commit = props.get("harness.commit")
    here = current_commit()
    if commit and commit != "unknown" and not here.startswith(commit):
        click.echo(f"note: the run used harness commit {commit}; this checkout is at "
                   f"{here[:len(commit)]}: tests and fixtures may differ", err=True)


def _resolve_build(build: RecordedBuild, source: Path | None,
                   work: Path) -> tuple[BuildInfo, Path]:
    if build.image:
        from harness.probes.docker_engine import docker_engine  # noqa: PLC0415 (container only)

        client = docker_engine()
        try:
            info = recorded_image(client, build)
        finally:
            client.close()
        record = work / "build.json"
        write_json_atomic(record, info.to_json())
        click.echo(f"image:    {build.image_id or build.image}")
        return info, record
    info, record = ensure_recorded_build(cache_root(), build, source,
                                         progress=_progress(click.echo))
    click.echo(f"llama-server: {info.binary}")
    return info, record


def _progress(echo: Callable[[str], None]) -> ProgressCallback:
    """A line at each tenth of a build (only called when the cache has no build)."""
    next_decile = 0.0

    def report(fraction: float | None, line: str) -> None:
        nonlocal next_decile
        if fraction is not None and fraction >= next_decile:
            echo(f"building llama-server: {fraction:.0%}")
            next_decile = int(fraction * 10) / 10 + 0.1

    return report


def _planner_gpu(recorded: RecordedFailure, info: BuildInfo, local: bool) -> GpuInfo | None:
    if not local:
        return recorded_planner_gpu(recorded.properties)
    devices = list_devices(Path(info.binary)) if info.image is None else ()
    here = detect_hardware(devices)
    if here.gpu == "none" or here.vram_mib is None:
        return None
    return GpuInfo(name=here.gpu, vram_mib=here.vram_mib)


def _print_commands(recorded: RecordedFailure, info: BuildInfo, build: RecordedBuild,
                    fixture_root: Path, external: str | None) -> None:
    if not recorded.server_argvs:
        click.echo("the test started no server (no 'server N argv' attachment)")
    index = fixture_index(fixture_root)
    binary = SERVER_PATH_IN_IMAGE if build.image else info.binary
    for number, argv in enumerate(recorded.server_argvs, 1):
        command = local_command(argv, binary, index)
        if external is not None:
            command = for_external(command, external)
        shown: LocalCommand = command
        if build.image and external is None:
            shown = docker_command(command, build.image_id or build.image)
        click.echo(f"server {number} command (run it by hand, or under `gdb --args`):")
        click.echo(f"  {shown.shell()}")
        for path in command.unmapped:
            click.echo(f"  note: {path} is no fixture: the test made it, and it may not exist "
                       "here", err=True)
    if recorded.server_argvs and external is None:
        click.echo("  note: --port 0 lets the kernel pick a free port; the server's "
                   "'listening on' line names it")
    if external is not None:
        click.echo(f"warning: the test attaches to the server at {external}; its launch flags "
                   "are your responsibility. Start it with the command above (host and port "
                   "set to that address) so it serves what the test expects.", err=True)
