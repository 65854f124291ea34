"""Where the fixture data lives in the package, and loading all of it at once."""

from __future__ import annotations

import hashlib
from pathlib import Path

from harness.modelgen.bundle_specs import BundleSpec, load_bundle_specs
from harness.modelgen.projector import PROJECTORS_SUBDIR, ProjectorSpec, load_projector_specs
from harness.modelgen.specs import FixtureSpec, load_fixture_specs
from harness.modelgen.writer import WRITER_VERSION
from harness.resources import card_path

SPECS_SUBDIR = "specs"
BUNDLES_SUBDIR = "bundles"


def fixture_spec_dir() -> Path:
    """The design card's ``fixtures/models/``: specs, bundle specs and the hash record."""
    return card_path("fixtures/models")


def spec_names(subdir: str) -> tuple[str, ...]:
    """Names of the spec files in ``subdir``, without parsing them (cheap, import-safe)."""
    return tuple(sorted(p.stem for p in (fixture_spec_dir() / subdir).glob("*.json")))


def load_all(spec_dir: Path | None = None) -> tuple[dict[str, FixtureSpec], dict[str, BundleSpec]]:
    base = spec_dir if spec_dir is not None else fixture_spec_dir()
    fixtures = load_fixture_specs(base / SPECS_SUBDIR)
    return fixtures, load_bundle_specs(base / BUNDLES_SUBDIR, fixtures)


def load_projectors(spec_dir: Path | None = None) -> dict[str, ProjectorSpec]:
    """The projector specs, each checked against the model fixtures it names."""
    base = spec_dir if spec_dir is not None else fixture_spec_dir()
    return load_projector_specs(base / PROJECTORS_SUBDIR, spec_names(SPECS_SUBDIR))


def specs_digest(spec_dir: Path | None = None) -> str:
    """A short digest of every spec file and the writer version: the cache directory key.

    Any edit to a spec, or a writer change that bumps WRITER_VERSION, lands in a fresh
    cache directory instead of mixing old and new files.
    """
    base = spec_dir if spec_dir is not None else fixture_spec_dir()
    digest = hashlib.sha256(f"writer {WRITER_VERSION}\n".encode())
    for sub in (SPECS_SUBDIR, BUNDLES_SUBDIR, PROJECTORS_SUBDIR):
        for path in sorted((base / sub).glob("*.json")):
            digest.update(f"{sub}/{path.name}\n".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]
