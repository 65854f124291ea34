"""The fixture tree: every file of a fixture root, in write order, with how to write it.

Models come first (generated ones before the truncated copies cut from them), then each
bundle's GGUF copies and manifest, then the vision projectors, so a file's inputs are
always written and verified before it is.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from harness.errors import FixtureError
from harness.facts.catalog import MANIFEST_NAME
from harness.modelgen.bundle_layout import bundle_members, manifest_bytes
from harness.modelgen.bundle_specs import BundleSpec
from harness.modelgen.projector import ProjectorSpec, write_projector
from harness.modelgen.specs import FixtureSpec
from harness.modelgen.writer import write_model, write_truncated

MODELS_DIR = "models"
PROJECTORS_DIR = "projectors"
BUNDLES_DIR = "bundles"

#: ``write(root, dest)``: write the file to ``dest``, reading inputs from under ``root``.
Writer = Callable[[Path, Path], object]


@dataclass(frozen=True)
class PlannedFile:
    rel: str  # path relative to the fixture root, "/"-separated (the sha256.json key)
    write: Writer


def model_rel(name: str) -> str:
    return f"{MODELS_DIR}/{name}.gguf"


def bundle_rel(name: str) -> str:
    return f"{BUNDLES_DIR}/{name}"


def projector_rel(name: str) -> str:
    return f"{PROJECTORS_DIR}/{name}.gguf"


def _projector_writer(spec: ProjectorSpec, text_embedding_length: int) -> Writer:
    return lambda _root, dest: write_projector(spec, text_embedding_length, dest)


def _model_writer(spec: FixtureSpec) -> Writer:
    if spec.truncation is not None:
        source = model_rel(spec.truncation.source)
        return lambda root, dest: write_truncated(spec, root / source, dest)
    return lambda _root, dest: write_model(spec, dest)


def _copy_writer(source_rel: str) -> Writer:
    return lambda root, dest: shutil.copyfile(root / source_rel, dest)


def _manifest_writer(spec: BundleSpec) -> Writer:
    return lambda _root, dest: dest.write_bytes(manifest_bytes(spec))


def plan_files(
    fixtures: Mapping[str, FixtureSpec], bundles: Mapping[str, BundleSpec],
    projectors: Mapping[str, ProjectorSpec] | None = None,
) -> list[PlannedFile]:
    ordered = sorted(fixtures.values(), key=lambda s: s.truncation is not None)
    files = [PlannedFile(model_rel(s.name), _model_writer(s)) for s in ordered]
    for bundle in bundles.values():
        base = bundle_rel(bundle.name)
        files += [
            PlannedFile(f"{base}/{inner}", _copy_writer(model_rel(fixture)))
            for inner, fixture in bundle_members(bundle)
        ]
        files.append(PlannedFile(f"{base}/{MANIFEST_NAME}", _manifest_writer(bundle)))
    for projector in (projectors or {}).values():
        shape = fixtures[projector.fits].shape
        if shape is None:
            raise FixtureError(f"projector {projector.name}: fits {projector.fits!r}, a cut "
                               "copy with no shape of its own; name a generated model")
        files.append(PlannedFile(projector_rel(projector.name),
                                 _projector_writer(projector, shape.embedding_length)))
    return files
