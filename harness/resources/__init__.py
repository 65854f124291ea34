"""The data files the harness's commands read, shipped inside the package.

Everything a command reads that is not Python lives here and is found through
``importlib.resources``, so a wheel installed anywhere reads the same files as a
checkout: the GPU configs (``gpu/``) and fork KV types, the JSON Schemas
(``schemas/``), the fixture and bundle specs with their hash record (``fixtures/``), the
pinned source manifest (``llama-cpp-source.json``), the per-backend Dockerfiles
(``docker/``), the known-flakes default, the Python pins the doctor checks
(``constraints.txt``) and the suites' pytest settings (``suites.ini``).
"""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from harness.errors import HarnessError


class ResourceError(HarnessError):
    """A packaged data file cannot be reached as a file."""


def resource_path(*parts: str) -> Path:
    """The file system path of the packaged data at ``parts`` (which may not exist).

    The harness hands these paths to Docker, pytest and jsonschema, so they must be
    real files: a wheel installed into a zip archive is refused with the fix.
    """
    target = files(__name__).joinpath(*parts)
    if not isinstance(target, Path):
        raise ResourceError(f"the harness's data file {'/'.join(parts)} is inside an "
                            f"archive ({target}); install the harness unpacked: "
                            f"pip install harness (not as a zip)")
    return target
