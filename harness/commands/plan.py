"""``harness plan``: show what would launch, every field's origin, and why.

Gathers the facts (GGUF header, GPU named on the command line, configs, the cached
build's capabilities, the ``HARNESS_*`` environment), calls the pure planner and prints
the plan as a table or JSON.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from harness.builds.devices_seen import plan_launch_env
from harness.builds.resolve import pinned_cpu_build
from harness.builds.under_test import BuildUnderTest, from_result, resolve_named_build
from harness.errors import HarnessError
from harness.facts.build import Backend
from harness.facts.gpu import GpuInfo
from harness.paths import cache_root
from harness.plan_request import read_plan_request
from harness.planning.decode_speed import (
    DecodePrediction,
    plan_bandwidths,
    predict_plan,
    prediction_depths,
)
from harness.planning.device_speed import SpreadPrediction, predict_spread
from harness.planning.launch_plan import LaunchPlan, PlanRequest, plan_launch
from harness.planning.rocm_env import RocmLaunchEnv
from harness.probes.bundles import load_bundle
from harness.probes.device_list import load_device_list
from harness.probes.host_memory import host_memory

#: What the plan predicts decode at: one device (or none), or a spread over several.
Prediction = DecodePrediction | SpreadPrediction
_SETTING_OPTIONS = ("ctx_size", "parallel", "cache_type_k", "cache_type_v", "flash_attn")


@click.command("plan")
@click.option("--gpu", "gpu_name", help="GPU name as the driver reports it.")
@click.option("--vram-mib", type=int, help="Total VRAM of that GPU in MiB.")
@click.option("--bundle", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="A fused bundle directory (manifest.json + text/).")
@click.option("--model", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="A bare GGUF to plan for instead of a bundle.")
@click.option("--ctx", "ctx_size", type=int, help="Override --ctx-size.")
@click.option("--parallel", type=int, help="Override --parallel.")
@click.option("--cache-type-k", help="Override --cache-type-k.")
@click.option("--cache-type-v", help="Override --cache-type-v.")
@click.option("--flash-attn", type=click.Choice(["on", "off", "auto"]),
              help="Override --flash-attn.")
@click.option("--build", "build_name", metavar="NAME",
              help="The build to plan for, as --harness-build names it: a build.json, a "
                   "llama-server binary or a build key (default: the cached CPU build).")
@click.option("--configs", type=click.Path(path_type=Path, file_okay=False, exists=True),
              help="Card config folder (default: the packaged configs/gpu).")
@click.option("--device-config", type=click.Path(path_type=Path, dir_okay=False, exists=True),
              help="Spread the model over the devices this file lists (cards and RPC "
                   "endpoints; configs/gpu/devices/README.md) instead of one --gpu.")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
def plan_command(*, gpu_name: str | None, vram_mib: int | None, bundle: Path | None,
                 model: Path | None, build_name: str | None, configs: Path | None,
                 device_config: Path | None, as_json: bool, **overrides: Any) -> None:
    """Plan a launch and print it: fields with origins, reasons, KV cache, argv."""
    if (bundle is None) == (model is None):
        raise click.UsageError("give exactly one of --bundle PATH or --model PATH")
    if (gpu_name is None) != (vram_mib is None):
        raise click.UsageError("--gpu and --vram-mib go together")
    if device_config is not None and gpu_name is not None:
        raise click.UsageError("give one GPU (--gpu) or a device list (--device-config)")
    build = (resolve_named_build(build_name, cache_root(), option="--build") if build_name
             else _cached_build())
    request = plan_request(bundle, model, gpu_name=gpu_name, vram_mib=vram_mib, build=build,
                           overrides=overrides, configs=configs)
    if device_config is not None:
        request = dataclasses.replace(request, devices=load_device_list(
            device_config, request.configs))
    plan = plan_launch(request)
    prediction = _predict(plan, request)
    binary = str(build.binary) if build else "llama-server"
    if as_json:
        click.echo(json.dumps({**plan.to_json(binary), "decode_prediction": (
            [p.to_json() for p in prediction] if isinstance(prediction, tuple)
            else {"unknown": prediction})}, indent=2))
    else:
        _print(plan, binary, build, prediction)


def _predict(plan: LaunchPlan, request: PlanRequest) -> tuple[Prediction, ...] | str:
    """The plan's predicted decode speed, or why there is none (planning/decode_speed.py,
    planning/device_speed.py for a spread over several devices)."""
    host = host_memory(cache_root()).bandwidth()
    if plan.devices is not None:
        context = plan.kv.n_ctx_seq if plan.kv is not None and plan.kv.valid else (
            request.model.context_length)
        return tuple(predict_spread(request.model, plan.devices, plan.kv,
                                    host_gbps=host.read_gbps, depth=depth,
                                    kv_offload=plan.spec.kv_offload is not False)
                     for depth in prediction_depths(context))
    bandwidths = plan_bandwidths(plan, request.gpu, host)
    if isinstance(bandwidths, str):
        return bandwidths
    return predict_plan(plan, request.model, bandwidths)


def _cached_build() -> BuildUnderTest | None:
    result = pinned_cpu_build(cache_root())
    return from_result(result) if result else None


def plan_request(bundle_dir: Path | None, model: Path | None, *, gpu_name: str | None,
                 vram_mib: int | None, build: BuildUnderTest | None,
                 overrides: dict[str, Any], configs: Path | None = None) -> PlanRequest:
    """The planner's facts for a launch of ``bundle_dir`` or ``model`` (``harness plan``
    and ``harness tune``), read as the suites read them (harness/plan_request.py);
    ``configs``: the card folder (None: the packaged one)."""
    return read_plan_request(
        build=build, bundle=load_bundle(bundle_dir) if bundle_dir else None,
        model=None if bundle_dir else model,
        gpu=GpuInfo(gpu_name, vram_mib) if gpu_name and vram_mib is not None else None,
        configs=configs,
        per_call={k: v for k, v in overrides.items() if k in _SETTING_OPTIONS and v is not None},
        launch_env=_launch_env(build))


def _launch_env(build: BuildUnderTest | None) -> RocmLaunchEnv | None:
    """A ROCm build's launch environment, as the suites launch it (the cards it has no
    code for hidden); where its devices cannot be listed the plan says so instead."""
    if build is None or build.backend is not Backend.ROCM:
        return None
    try:
        return plan_launch_env(build, build.info.image if build.info else None)
    except HarnessError as exc:
        return RocmLaunchEnv(reason=f"not planned: the build's devices could not be listed "
                                    f"({exc})")


def _print(plan: LaunchPlan, binary: str, build: BuildUnderTest | None,
           prediction: tuple[Prediction, ...] | str) -> None:
    console = Console(soft_wrap=True)
    console.print(f"[bold]route[/] {plan.route.backend.value} ({plan.route.reason.value}): "
                  f"{plan.route.detail}", highlight=False)
    console.print(f"[bold]autotune[/] {plan.tune.headline}", highlight=False)
    if build is None:
        console.print("[yellow]no cached build: capabilities unknown, cache types unchecked "
                      "(run `harness build` or pass --build)[/]")
    table = Table(title="launch fields")
    table.add_column("field")
    table.add_column("value", overflow="fold")
    table.add_column("origin")
    for name, origin in plan.origins.items():
        value = getattr(plan.spec, name)
        table.add_row(name, str(getattr(value, "value", value)), origin)
    console.print(table)
    if plan.devices is not None:
        console.print(f"[bold]devices[/] --split-mode {plan.devices.split_mode}, "
                      f"--tensor-split {plan.devices.tensor_split_arg} "
                      f"({plan.devices.spread})", highlight=False)
        for row in plan.devices.describe_rows():
            console.print(f"  - {row}", highlight=False, markup=False)
    if plan.kv is not None:
        kv = plan.kv
        console.print(f"[bold]KV cache[/] {kv.cells} cells, K {kv.k_bytes} bytes, "
                      f"V {kv.v_bytes} bytes", highlight=False)
    if isinstance(prediction, str):
        console.print(f"[bold]predicted decode[/] unknown: {prediction}", highlight=False,
                      markup=False)
    for predicted in () if isinstance(prediction, str) else prediction:
        console.print("[bold]predicted decode[/] " + predicted.describe(), highlight=False)
    console.print("[bold]reasons[/]")
    for reason in plan.reasons:
        console.print(f"  - {reason}", highlight=False, markup=False)
    for warning in plan.warnings:
        console.print(f"[bold yellow]warning[/] {warning.code}: {warning.message}",
                      highlight=False)
    console.print("[bold]argv[/]")
    assigned = [f"{name}={value}" for name, value in sorted(plan.environment.items())]
    console.print(" ".join([*assigned, *plan.to_argv(binary, "127.0.0.1", 0)]), highlight=False,
                  markup=False)
