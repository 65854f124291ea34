"""The ``harness`` command: one module per subcommand in this package.

Every public module here defines one click command named after it (``base_image.py`` is
``harness base-image``); the group below lists what it finds, so a new command is a new
module and nothing else. Modules starting with ``_`` hold what commands share.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import sys

import click
from rich.console import Console

from harness.errors import HarnessError

console = Console(stderr=True)


@functools.cache
def command_modules() -> tuple[str, ...]:
    """The names of this package's command modules, sorted (read once: the group asks for
    them on every command it looks up)."""
    return tuple(sorted(info.name for info in pkgutil.iter_modules(__path__)
                        if not info.name.startswith("_")))


def command_of(module_name: str) -> click.Command:
    """The one click command a command module defines (the one named after it)."""
    module = importlib.import_module(f"{__name__}.{module_name}")
    wanted = module_name.replace("_", "-")
    found = [value for value in vars(module).values()
             if isinstance(value, click.Command) and value.name == wanted]
    if len(found) != 1:
        raise RuntimeError(f"{module.__name__} defines {len(found)} click commands named "
                           f"{wanted!r}; a command module defines exactly one")
    return found[0]


class _CommandPerModule(click.Group):
    """A group whose commands are this package's modules, each imported only when it is
    the one asked for: importing every command (the store's SQLAlchemy, matplotlib, the
    Docker client, the fixture writer) cost every invocation about 2.5 s."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [name.replace("_", "-") for name in command_modules()]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        module_name = cmd_name.replace("-", "_")
        if module_name not in command_modules():
            return None
        return command_of(module_name)


@click.group(cls=_CommandPerModule)
def cli() -> None:
    """Regression harness for llama-server builds."""


def main() -> None:
    try:
        cli(standalone_mode=True)
    except HarnessError as exc:
        # markup off: build logs and paths contain square brackets rich would eat.
        console.print(f"error: {exc}", style="bold red", highlight=False, markup=False,
                      soft_wrap=True)
        sys.exit(2)
