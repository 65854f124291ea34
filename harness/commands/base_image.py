"""``harness base-image``: a Debian base image made locally (debootstrap, docker import)."""

from __future__ import annotations

import time

import click

from harness.builds.base_image import ensure_base_image
from harness.commands._progress import console
from harness.errors import ConfigError
from harness.facts.build import Backend
from harness.paths import cache_root
from harness.planning.base_image import SUITES
from harness.planning.container_plan import LOCAL_BASES, LocalBase
from harness.probes.docker_engine import docker_engine


@click.command("base-image")
@click.option("--distro", type=click.Choice(sorted(SUITES)), default=None,
              help="Debian release  [default: debian:13, or the --backend's]")
@click.option("--components", default=None, metavar="LIST",
              help="Archive areas, comma separated, part of the key (main, contrib, non-free, "
                   "non-free-firmware)  [default: main, or the --backend's]")
@click.option("--backend", type=click.Choice([b.value for b in Backend]), default=None,
              help="Make the base that backend's image builds from locally (cuda: debian:13 "
                   "with contrib and non-free; rocm: debian:sid; cpu, vulkan: debian:13).")
def base_image_command(distro: str | None, components: str | None, backend: str | None) -> None:
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
