"""The ``harness`` command: build llama-server, write fixtures, run the suites."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from harness import modelgen
from harness.ab_cli import ab_command
from harness.builds.base_image import ensure_base_image
from harness.builds.container_build import LOCAL, build_image, list_images
from harness.builds.native import BuildResult, ProgressCallback
from harness.builds.resolve import ensure_build, resolve_source
from harness.calibrate_cli import calibrate_command
from harness.compare_cli import compare_command
from harness.doctor_cli import doctor_command
from harness.errors import ConfigError, HarnessError
from harness.facts.build import Backend, BuildInfo
from harness.paths import SUITES_DIR, cache_root, suites_pytest_config
from harness.plan_cli import plan_command
from harness.planning.base_image import SUITES
from harness.planning.build_plan import BuildRequest
from harness.planning.container_plan import IMAGE_ARGS, LOCAL_BASES, LocalBase
from harness.probes.docker_engine import docker_engine
from harness.recording.run_file import new_run_id
from harness.report.allure import generate_report
from harness.report.baseline_figures import baseline_picture
from harness.report.global_attachments import GlobalAttachment
from harness.report.report_cli import default_history_path, report_command
from harness.repro_cli import repro_command
from harness.results.run_record import RunRecord
from harness.results.store_cli import store_command, store_run
from harness.service.service_cli import serve_command, upload_command

console = Console(stderr=True)


@click.group()
def cli() -> None:
    """Regression harness for llama-server builds."""


@cli.command()
@click.option("--backend", type=click.Choice([b.value for b in Backend]), default="cpu",
              show_default=True, help="ggml backend to build.")
@click.option("--source", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=lambda: os.environ.get("HARNESS_SOURCE") or None,
              help="A local llama.cpp checkout or fork to build instead of the pinned source "
                   "[env HARNESS_SOURCE].")
@click.option("--native/--portable", default=False, show_default=True,
              help="GGML_NATIVE: tune for this CPU (not portable to other machines).")
@click.option("--cmake-arg", "cmake_args", multiple=True,
              help="Extra -D flag for CMake; repeatable; part of the build key.")
@click.option("--cuda-arch", "cuda_archs", default="", metavar="ARCHS",
              help="CUDA: compute capabilities to compile, comma separated (e.g. 90 or 89,90; "
                   "default: ggml's portable list; --reduced: 90).")
@click.option("--amdgpu-targets", "amdgpu_targets", default="", metavar="TARGETS",
              help="ROCm: gfx targets to compile, comma separated (e.g. gfx1100; default: the "
                   "GPUs present natively, the Dockerfile's list in a container; --reduced: "
                   "gfx1100).")
@click.option("--reduced", is_flag=True,
              help="CUDA/ROCm: the reduced variant CI builds — one architecture, no "
                   "FlashAttention kernels; named in the build key.")
@click.option("--container", is_flag=True,
              help="Build an image (harness/resources/docker/<backend>.Dockerfile) instead "
                   "of a native binary.")
@click.option("--base", "bases", multiple=True, metavar="ARG=IMAGE",
              help="With --container: BUILD_BASE=IMAGE or RUNTIME_BASE=IMAGE (repeatable), "
                   "or `local`: both stages from the backend's local Debian base (made by "
                   "debootstrap when missing; CUDA and ROCm then install Debian's toolkits). "
                   "Default: the Dockerfile's bases if the engine has them, else local.")
def build(*, backend: str, source: Path | None, native: bool, cmake_args: tuple[str, ...],
          cuda_archs: str, amdgpu_targets: str, reduced: bool, container: bool,
          bases: tuple[str, ...]) -> None:
    """Build llama-server (cached by source, backend, flags and compiler or base images)."""
    chosen = Backend(backend)
    archs = _gpu_archs(chosen, cuda_archs, amdgpu_targets)
    try:
        request = BuildRequest(backend=chosen, native=native, extra_cmake_args=cmake_args,
                               gpu_archs=archs, reduced=reduced)
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None
    if container:
        click.echo(_build_image_with_progress(request, source, _parse_bases(bases)).image)
        return
    if bases:
        raise click.UsageError("--base goes with --container")
    result = _build_with_progress(request, source)
    click.echo(result.info.binary)


@cli.command()
def images() -> None:
    """List the llama-server images harness builds made on this Docker engine."""
    found = list_images(docker_engine())
    if not found:
        console.print("no harness-built llama-server images on this engine")
        return
    for info in found:
        click.echo(f"{info.image}  {info.backend.value:6}  {info.version_line}  "
                   f"source {info.source_digest[:12]}  built in {info.build_seconds:.0f}s")


@cli.command()
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), default=None,
              help="Directory to write into (default: the fixture cache).")
@click.option("--record", is_flag=True,
              help="Write everything fresh and rewrite harness/resources/fixtures/sha256.json.")
@click.option("--check", is_flag=True,
              help="Write everything fresh and list files whose hash differs from the record.")
def fixtures(out: Path | None, record: bool, check: bool) -> None:
    """Write the GGUF fixtures and bundles, verified against the recorded sha256s."""
    if record or check:
        with tempfile.TemporaryDirectory(prefix="harness-fixtures-") as tmp:
            written = modelgen.write_all(out or Path(tmp))
        if record:
            modelgen.record_hashes(written)
            click.echo(f"recorded {len(written)} hashes")
            return
        recorded = modelgen.read_recorded_hashes()
        differ = sorted(k for k in written.keys() | recorded.keys()
                        if written.get(k) != recorded.get(k))
        for rel in differ:
            click.echo(f"differs from the record: {rel}")
        sys.exit(1 if differ else 0)
    fixture_set = modelgen.ensure_fixtures(out)
    for name, path in fixture_set.models.items():
        click.echo(f"{name:16} {path}")
    for name, path in fixture_set.bundles.items():
        click.echo(f"{name:16} {path}")


@cli.command(context_settings={"ignore_unknown_options": True})
@click.option("--alluredir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("allure-results"), show_default=True,
              help="Where allure-pytest writes the results (relative: to the working "
                   "directory).")
@click.option("--report-dir", type=click.Path(path_type=Path, file_okay=False),
              default=Path("allure-report"), show_default=True,
              help="Where the Allure HTML report is written.")
@click.option("--run-record", type=click.Path(path_type=Path, dir_okay=False),
              default=Path("harness-run") / "run.json", show_default=True,
              help="Where the run record (outcomes, hardware, build, figures) is written.")
@click.option("--results-url", envvar="HARNESS_RESULTS_URL", default=None,
              help="Results store for the run record [env HARNESS_RESULTS_URL; default: a "
                   "SQLite file in the harness cache].")
@click.option("--single-file", is_flag=True,
              help="Also write the report as one self-contained HTML file (a CI artifact).")
@click.option("--workers", default="auto", show_default=True,
              help="pytest-xdist workers for the suites.")
@click.option("--bundles", type=click.Path(path_type=Path, file_okay=False, exists=True),
              default=None,
              help="A folder of your own fused bundles (one subfolder each, in the fixtures' "
                   "layout): the suites parametrized over bundles run over them too "
                   "(--harness-bundles; env HARNESS_BUNDLES).")
@click.argument("pytest_args", nargs=-1, type=click.UNPROCESSED)
def run(*, alluredir: Path, report_dir: Path, run_record: Path, results_url: str | None,
        single_file: bool, workers: str, bundles: Path | None,
        pytest_args: tuple[str, ...]) -> None:
    """The main job: build, fixtures, suites, run record into the store, Allure report."""
    result = _build_with_progress(BuildRequest(), None)
    fixture_set = modelgen.ensure_fixtures()
    console.print(f"[bold]fixtures[/] {fixture_set.root}")
    alluredir, report_dir, run_record = (p.absolute() for p in (alluredir, report_dir, run_record))
    run_record.unlink(missing_ok=True)
    run_id = new_run_id()
    argv = [
        sys.executable, "-m", "pytest", str(SUITES_DIR), *suites_pytest_config(), "-n", workers,
        f"--alluredir={alluredir}", "--clean-alluredir",
        f"--harness-server-bin={result.info.binary}", f"--harness-run-record={run_record}",
        *([f"--harness-bundles={bundles.absolute()}"] if bundles else []), *pytest_args,
    ]
    console.print("[bold]running[/] " + " ".join(argv[2:]))
    code = subprocess.call(argv, env={**os.environ, "HARNESS_RUN_ID": run_id})
    console.print(f"[bold]Allure results[/] {alluredir}")
    pictures: tuple[GlobalAttachment, ...] = ()
    if run_record.is_file():
        stored, created, where = store_run(run_record, results_url)
        state = "stored" if created else "already stored"
        console.print(f"[bold]run {stored.run_id}[/] {state} in {where} "
                      f"({len(stored.figures)} figures); record {run_record}", soft_wrap=True)
        pictures = _baseline_picture(stored, results_url)
    else:
        console.print(f"no run record at {run_record}: pytest ended before writing it")
    report = generate_report(alluredir, report_dir, history_path=default_history_path(),
                             global_attachments=pictures)
    for problem in report.problems:
        console.print(f"warning: left out of the report: {problem}", markup=False)
    if single_file:
        single = generate_report(alluredir, report_dir.with_name(report_dir.name + "-single"),
                                 history_path=None, single_file=True)
        console.print(f"[bold]single-file report[/] {single.index_html}", soft_wrap=True)
    console.print(f"[bold]suites {'passed' if code == 0 else 'FAILED'}[/] (pytest exit {code})")
    console.print(f"[bold]Allure report[/] {report.index_html}", soft_wrap=True)
    sys.exit(code)


def _baseline_picture(run: RunRecord, results_url: str | None) -> tuple[GlobalAttachment, ...]:
    try:
        return baseline_picture(run, results_url)
    except HarnessError as exc:
        console.print(f"warning: no picture of the figures against the baseline: {exc}",
                      markup=False)
        return ()


def _gpu_archs(backend: Backend, cuda_archs: str, amdgpu_targets: str) -> tuple[str, ...]:
    """The architecture option that belongs to ``backend``; the other one is an error."""
    for option, value, owner in (("--cuda-arch", cuda_archs, Backend.CUDA),
                                 ("--amdgpu-targets", amdgpu_targets, Backend.ROCM)):
        if value and backend is not owner:
            raise click.UsageError(f"{option} is for --backend {owner.value}, "
                                   f"not {backend.value}")
    chosen = cuda_archs if backend is Backend.CUDA else amdgpu_targets
    return tuple(part.strip() for part in chosen.split(",") if part.strip())


def _parse_bases(bases: tuple[str, ...]) -> dict[str, str]:
    parsed = {}
    for item in bases:
        if item == LOCAL:
            parsed.update(dict.fromkeys(IMAGE_ARGS, LOCAL))
            continue
        arg, sep, image = item.partition("=")
        if not sep or not image:
            raise click.BadParameter(f"{item!r} is not ARG=IMAGE", param_hint="--base")
        parsed[arg] = image
    return parsed


def _build_image_with_progress(request: BuildRequest, source: Path | None,
                               bases: dict[str, str]) -> BuildInfo:
    cache = cache_root()
    client = docker_engine()
    started = time.monotonic()
    with _progress_bar(request) as report:
        result = build_image(client, cache, resolve_source(cache, source), request,
                             bases=bases or None, progress=report)
    took = time.monotonic() - started
    state = "cache hit" if result.cache_hit else f"built in {result.info.build_seconds:.0f}s"
    console.print(f"[bold]image[/] {result.info.image} ({state}, {took:.2f}s)", soft_wrap=True)
    return result.info


def _build_with_progress(request: BuildRequest, source: Path | None) -> BuildResult:
    cache = cache_root()
    started = time.monotonic()
    with _progress_bar(request) as report:
        result = ensure_build(cache, request, source, progress=report)
    took = time.monotonic() - started
    state = "cache hit" if result.cache_hit else f"built in {result.info.build_seconds:.0f}s"
    console.print(f"[bold]llama-server[/] {result.info.binary} ({state}, {took:.2f}s)",
                  soft_wrap=True)
    return result


@contextlib.contextmanager
def _progress_bar(request: BuildRequest) -> Iterator[ProgressCallback]:
    """A live bar on a terminal; in a CI log, a line every tenth of the way."""
    with Progress(TextColumn("[bold]build[/] {task.description}"), BarColumn(),
                  TextColumn("{task.percentage:>3.0f}%"), TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(f"llama-server ({request.backend.value})", total=1.0)
        next_decile = 0.1

        def report(fraction: float | None, line: str) -> None:
            nonlocal next_decile
            if fraction is None:
                return
            progress.update(task, completed=fraction)
            if not console.is_terminal and fraction >= next_decile:
                console.print(f"build {request.backend.value}: {fraction:.0%}", soft_wrap=True)
                next_decile = int(fraction * 10) / 10 + 0.1

        yield report


cli.add_command(plan_command)
cli.add_command(report_command)
cli.add_command(compare_command)
cli.add_command(ab_command)
cli.add_command(store_command)
cli.add_command(serve_command)
cli.add_command(upload_command)
cli.add_command(doctor_command)
cli.add_command(repro_command)
cli.add_command(calibrate_command)


@cli.command("base-image")
@click.option("--distro", type=click.Choice(sorted(SUITES)), default=None,
              help="Debian release  [default: debian:13, or the --backend's]")
@click.option("--components", default=None, metavar="LIST",
              help="Archive areas, comma separated, part of the key (main, contrib, non-free, "
                   "non-free-firmware)  [default: main, or the --backend's]")
@click.option("--backend", type=click.Choice([b.value for b in Backend]), default=None,
              help="Make the base that backend's image builds from locally (cuda: debian:13 "
                   "with contrib and non-free; rocm: debian:sid; cpu, vulkan: debian:13).")
def base_image(distro: str | None, components: str | None, backend: str | None) -> None:
    """Make a Debian base image locally (debootstrap + docker import), cached by content."""
    local = LOCAL_BASES[Backend(backend)] if backend else LocalBase("debian:13")
    chosen_distro = distro or local.distro
    chosen = tuple(c.strip() for c in components.split(",") if c.strip()) if components \
        else local.components
    client = docker_engine()
    started = time.monotonic()
    with console.status(f"debootstrap {chosen_distro}"):
        try:
            image = ensure_base_image(client, chosen_distro, cache_root() / "base-images",
                                      components=chosen)
        except ConfigError as exc:
            raise click.UsageError(str(exc)) from None
    state = "cache hit" if image.cache_hit else f"made in {time.monotonic() - started:.0f}s"
    console.print(f"[bold]{image.tag}[/] {image.image_id[:19]} key {image.key} ({state})",
                  soft_wrap=True)
    click.echo(image.tag)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except HarnessError as exc:
        # markup off: build logs and paths contain square brackets rich would eat.
        console.print(f"error: {exc}", style="bold red", highlight=False, markup=False,
                      soft_wrap=True)
        sys.exit(2)
