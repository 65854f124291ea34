"""The ``harness`` command: one module per subcommand in this package.

Every public module here defines one click command named after it (``base_image.py`` is
``harness base-image``); the group below lists what it finds, so a new command is a new
module and nothing else. Modules starting with ``_`` hold what commands share.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import click
from rich.console import Console

from harness.errors import HarnessError

console = Console(stderr=True)


def command_modules() -> tuple[str, ...]:
    """The names of this package's command modules, sorted."""
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


@click.group()
def cli() -> None:
    """Regression harness for llama-server builds."""


for _name in command_modules():
    cli.add_command(command_of(_name))


def main() -> None:
    try:
        cli(standalone_mode=True)
    except HarnessError as exc:
        # markup off: build logs and paths contain square brackets rich would eat.
        console.print(f"error: {exc}", style="bold red", highlight=False, markup=False,
                      soft_wrap=True)
        sys.exit(2)
