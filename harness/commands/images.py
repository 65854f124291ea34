"""``harness images``: the llama-server images harness builds made on this Docker engine."""

from __future__ import annotations

import click

from harness.builds.container_build import list_images
from harness.commands._progress import console
from harness.probes.docker_engine import docker_engine


@click.command("images")
def images_command() -> None:
    """List the llama-server images harness builds made on this Docker engine."""
    found = list_images(docker_engine())
    if not found:
        console.print("no harness-built llama-server images on this engine")
        return
    for info in found:
        click.echo(f"{info.image}  {info.backend.value:6}  {info.version_line}  "
                   f"source {info.source_digest[:12]}  built in {info.build_seconds:.0f}s")
