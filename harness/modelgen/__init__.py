"""Tiny deterministic GGUF fixtures and fused bundles, written from specs and verified.

Specs live in ``fixtures/models/specs/*.json`` (one tiny model each) and
``fixtures/models/bundles/*.json`` (fused bundles built from those models); the sha256 of
every written file is recorded in ``fixtures/models/sha256.json``. ``ensure_fixtures``
gives tests a verified fixture root in the cache; ``write_all`` regenerates everything.
"""

from __future__ import annotations

import hashlib
import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from harness.bounded import bounded_lock
from harness.errors import FixtureError, UnknownFixtureError
from harness.modelgen.cache import ensure_tree, write_tree
from harness.modelgen.fixture_data import (
    BUNDLES_SUBDIR,
    SPECS_SUBDIR,
    fixture_spec_dir,
    load_all,
    load_projectors,
    spec_names,
    specs_digest,
)
from harness.modelgen.fixture_tree import bundle_rel, model_rel, plan_files, projector_rel
from harness.modelgen.hashes import RECORD_NAME, read_hashes, write_hashes
from harness.modelgen.specs import load_fixture_specs
from harness.modelgen.writer import WRITER_VERSION, write_model
from harness.paths import cache_root

__all__ = [
    "BUNDLE_NAMES",
    "FIXTURE_NAMES",
    "FixtureSet",
    "ensure_fixtures",
    "ensure_large_fixture",
    "fixture_model",
    "fixture_spec_dir",
    "large_fixture_folder",
    "read_recorded_hashes",
    "record_hashes",
    "write_all",
]

#: All fixture names, in spec order (the spec files' names, sorted).
FIXTURE_NAMES: tuple[str, ...] = spec_names(SPECS_SUBDIR)
#: The large fixtures' folder under the specs (written on demand, never recorded), and
#: the one the decode-prediction benchmark uses.
LARGE_SUBDIR = "large"
LARGE_FIXTURE = "bench-large"
#: Seconds a caller waits for another process writing the large fixture (about 300 MiB:
#: under a minute). Half of pytest-timeout's 600 s, so a stuck writer is named in the
#: test's own failure rather than ending the worker.
LARGE_LOCK_WAIT_S = 300.0
#: All bundle names, in spec order.
BUNDLE_NAMES: tuple[str, ...] = spec_names(BUNDLES_SUBDIR)


@dataclass(frozen=True)
class FixtureSet:
    """A verified fixture root: fixture name -> GGUF path, bundle name -> bundle dir."""

    root: Path
    models: Mapping[str, Path]
    bundles: Mapping[str, Path]
    #: Vision projectors (``--mmproj`` files), by name.
    projectors: Mapping[str, Path] = field(
        default_factory=lambda: types.MappingProxyType({}))

    def model(self, name: str) -> Path:
        return _lookup("fixture", name, self.models)

    def bundle(self, name: str) -> Path:
        return _lookup("bundle", name, self.bundles)

    def projector(self, name: str) -> Path:
        return _lookup("projector", name, self.projectors)


def _lookup(what: str, name: str, table: Mapping[str, Path]) -> Path:
    try:
        return table[name]
    except KeyError:
        raise UnknownFixtureError(
            f"unknown {what} {name!r}; known {what}s: {', '.join(table)} "
            f"(specs in {fixture_spec_dir()})"
        ) from None


def read_recorded_hashes() -> dict[str, str]:
    """The committed record: path relative to a fixture root -> sha256."""
    return read_hashes(fixture_spec_dir() / RECORD_NAME)


def record_hashes(hashes: Mapping[str, str]) -> None:
    """Replace the committed record with ``hashes`` (after an intended writer change)."""
    write_hashes(fixture_spec_dir() / RECORD_NAME, hashes)


def write_all(out_dir: Path) -> dict[str, str]:
    """Write every fixture and bundle fresh into ``out_dir``; relative path -> sha256."""
    fixtures, bundles = load_all()
    return write_tree(out_dir, plan_files(fixtures, bundles, load_projectors()))


def ensure_large_fixture(name: str = LARGE_FIXTURE, cache: Path | None = None) -> Path:
    """The large fixture ``name`` (``fixtures/large/<name>.json``), written when missing.

    Too big for the fixture set every run writes and verifies, it is written only when
    asked for, under ``<cache>/fixtures-large/<digest of its spec + writer version>/``,
    atomically and under a file lock; the writer is deterministic, so its bytes follow
    from the spec, and no hash of it is committed.
    """
    specs = load_fixture_specs(fixture_spec_dir() / LARGE_SUBDIR)
    if name not in specs:
        raise UnknownFixtureError(f"unknown large fixture {name!r}; known: "
                                  f"{', '.join(specs)} (specs in "
                                  f"{fixture_spec_dir() / LARGE_SUBDIR})")
    folder = large_fixture_folder(name, cache)
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / f"{name}.gguf"
    with bounded_lock(folder / ".lock", wait_s=LARGE_LOCK_WAIT_S,
                      purpose=f"writing the large fixture {name}", error=FixtureError,
                      setting="harness.modelgen.LARGE_LOCK_WAIT_S"):
        if not target.is_file():
            partial = target.with_suffix(".partial")
            write_model(specs[name], partial)
            partial.replace(target)
    return target


def fixture_model(name: str) -> Path:
    """The model file of fixture ``name``: one of the fixture set, or a large fixture
    (written on demand by :func:`ensure_large_fixture`). The error names both lists."""
    large = spec_names(LARGE_SUBDIR)
    if name in large:
        return ensure_large_fixture(name)
    try:
        return ensure_fixtures().model(name)
    except UnknownFixtureError as exc:
        raise UnknownFixtureError(f"{exc}; large fixtures: {', '.join(large)}") from None


def large_fixture_folder(name: str, cache: Path | None = None) -> Path:
    """Where the large fixture ``name`` is written: named by its spec and the writer."""
    spec_path = fixture_spec_dir() / LARGE_SUBDIR / f"{name}.json"
    digest = hashlib.sha256(f"writer {WRITER_VERSION}\n".encode() + spec_path.read_bytes())
    return (cache or cache_root()) / "fixtures-large" / digest.hexdigest()[:16]


def ensure_fixtures(root: Path | None = None) -> FixtureSet:
    """A fixture root whose every file matches ``sha256.json``, writing what is missing.

    The default root is ``<cache>/fixtures/<digest of specs + writer version>``. Files
    are written once under a file lock, so concurrent xdist workers share them.
    """
    fixtures, bundles = load_all()
    projectors = load_projectors()
    base = root if root is not None else cache_root() / "fixtures" / specs_digest()
    ensure_tree(base, plan_files(fixtures, bundles, projectors), read_recorded_hashes())
    return FixtureSet(
        root=base,
        models=types.MappingProxyType({n: base / model_rel(n) for n in fixtures}),
        bundles=types.MappingProxyType({n: base / bundle_rel(n) for n in bundles}),
        projectors=types.MappingProxyType({n: base / projector_rel(n) for n in projectors}),
    )
