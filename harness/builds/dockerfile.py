"""Where the harness's per-backend Dockerfiles live: the design card's
``ci/docker/<backend>.Dockerfile`` (the package ``harness.ci`` in a wheel).

The container build reads the file it names; the tests' parser of these files is
``tests/dockerfile_parser.py``, since nothing in production needs to read one.
"""

from __future__ import annotations

from pathlib import Path

from harness.facts.build import Backend
from harness.resources import card_path

#: Where the per-backend Dockerfiles live: ``<backend>.Dockerfile`` in ``ci/docker/``.
DOCKERFILE_DIR = card_path("ci", "docker")


def dockerfile_path(backend: Backend) -> Path:
    """The Dockerfile that builds llama-server for ``backend`` (the path; nothing is read)."""
    return DOCKERFILE_DIR / f"{backend.value}.Dockerfile"
