"""The data files the harness's commands read, found the same way in a checkout and a wheel.

Two homes, one lookup (``importlib.resources``):

- the **design card's folders** at the top of the checkout — ``suites/``,
  ``fixtures/models/``, ``configs/gpu/`` and ``ci/`` — which the wheel carries as the
  packages ``harness.suites``, ``harness.fixtures_models``, ``harness.configs_gpu`` and
  ``harness.ci`` (``pyproject.toml`` maps each package name to its folder; an editable
  install maps them the same way, so ``files("harness.configs_gpu")`` is ``configs/gpu/``
  in a checkout and ``site-packages/harness/configs_gpu/`` in a wheel);
- this package, for the files only the harness itself reads: the JSON Schemas
  (``schemas/``), the pinned source manifest (``llama-cpp-source.json``), the known-flakes
  default, the Python pins the doctor checks (``constraints.txt``) and the suites' pytest
  settings (``suites.ini``).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path
from types import MappingProxyType

from harness.errors import HarnessError

#: Each design-card folder (its path in a checkout) and the package that carries it in
#: the wheel: the path with ``/`` as ``_``, under ``harness``.
CARD_FOLDERS = MappingProxyType({
    "suites": "harness.suites",
    "fixtures/models": "harness.fixtures_models",
    "configs/gpu": "harness.configs_gpu",
    "ci": "harness.ci",
})


class ResourceError(HarnessError):
    """A packaged data file cannot be reached as a file."""


def _as_path(target: object, name: str) -> Path:
    # The harness hands these paths to Docker, pytest and jsonschema, so they must be
    # real files: a wheel installed into a zip archive is refused with the fix.
    if not isinstance(target, Path):
        raise ResourceError(f"the harness's data file {name} is inside an archive "
                            f"({target}); install the harness unpacked: pip install harness "
                            f"(not as a zip)")
    return target


def resource_path(*parts: str) -> Path:
    """The file system path of the harness's own data at ``parts`` (which may not exist)."""
    return _as_path(files(__name__).joinpath(*parts), "/".join(parts))


def card_path(folder: str, *parts: str) -> Path:
    """The path of ``parts`` inside the design-card ``folder`` (``"configs/gpu"``, …).

    An unknown folder is a programming error and says which exist. A checkout whose
    harness was not installed (``PYTHONPATH=.``) has no mapping to import: the folder is
    then read beside the ``harness`` package, where the checkout keeps it.
    """
    if folder not in CARD_FOLDERS:
        raise ValueError(f"{folder!r} is not a design-card folder: {sorted(CARD_FOLDERS)}")
    try:
        root = files(CARD_FOLDERS[folder])
    except ModuleNotFoundError:
        root = Path(__file__).resolve().parents[2].joinpath(*folder.split("/"))
    return _as_path(root.joinpath(*parts), "/".join((folder, *parts)))
