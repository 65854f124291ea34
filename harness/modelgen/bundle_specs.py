"""Fused bundle specs: which fixtures make up a bundle and the catalog entry it carries.

One JSON file per bundle under ``fixtures/models/bundles/``; the bundle's name is the
file's stem. Model and drafter refer to fixture names, checked against the fixture specs.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from harness import strictjson as sj
from harness.errors import FixtureError, UnknownFixtureError
from harness.facts.gpu import STOCK_CACHE_TYPES
from harness.modelgen.specs import FixtureSpec


class SpecType(enum.StrEnum):
    """Speculative types a bundle may declare; values are llama-server's ``--spec-type``."""

    DRAFT_SIMPLE = "draft-simple"
    DRAFT_MTP = "draft-mtp"


#: A bundle runs on the stock server the fixtures test, so only its cache types.
CACHE_TYPES = frozenset(STOCK_CACHE_TYPES)


@dataclass(frozen=True)
class BundleSpec:
    name: str
    description: str
    path: Path
    id: str
    model: str
    drafter: str | None
    runtime_class: str
    context_length: int
    cache_type_k: str
    cache_type_v: str
    spec_type: SpecType
    tags: tuple[str, ...]


_REQUIRED = (
    "description",
    "id",
    "model",
    "drafter",
    "runtime_class",
    "context_length",
    "cache_type_k",
    "cache_type_v",
    "spec_type",
)
_OPTIONAL = ("tags",)


def load_bundle_spec(path: Path, fixtures: Mapping[str, FixtureSpec]) -> BundleSpec:
    obj = sj.read_object(path)
    sj.check_keys(path, obj, _REQUIRED, _OPTIONAL)
    spec = BundleSpec(
        name=path.stem,
        description=sj.get_str(path, obj, "description"),
        path=path,
        id=sj.get_str(path, obj, "id"),
        model=sj.get_str(path, obj, "model"),
        drafter=sj.get_opt_str(path, obj, "drafter"),
        runtime_class=sj.get_str(path, obj, "runtime_class"),
        context_length=sj.get_int(path, obj, "context_length", minimum=1),
        cache_type_k=sj.get_choice(path, obj, "cache_type_k", CACHE_TYPES),
        cache_type_v=sj.get_choice(path, obj, "cache_type_v", CACHE_TYPES),
        spec_type=SpecType(sj.get_choice(path, obj, "spec_type", list(SpecType))),
        tags=sj.get_str_list(path, obj, "tags"),
    )
    _validate(spec, fixtures)
    return spec


def _validate(spec: BundleSpec, fixtures: Mapping[str, FixtureSpec]) -> None:
    for role, name in (("model", spec.model), ("drafter", spec.drafter)):
        if name is not None and name not in fixtures:
            raise UnknownFixtureError(
                f"{spec.path}: {role} {name!r} is not a fixture; "
                f"known fixtures: {', '.join(fixtures)}"
            )
    if "/" in spec.id or spec.id.startswith("."):
        raise FixtureError(f"{spec.path}: id {spec.id!r} must be a plain file-name stem")
    model = fixtures[spec.model].shape
    if model is None:
        raise FixtureError(f"{spec.path}: model {spec.model!r} is not a generated model")
    if spec.spec_type is SpecType.DRAFT_SIMPLE and spec.drafter is None:
        raise FixtureError(f"{spec.path}: spec_type draft-simple needs a drafter")
    if spec.spec_type is SpecType.DRAFT_MTP:
        if spec.drafter is not None:
            raise FixtureError(
                f"{spec.path}: draft-mtp drafts from the model itself; drafter must be null"
            )
        if model.nextn_predict_layers == 0:
            raise FixtureError(f"{spec.path}: draft-mtp needs a model with an MTP (nextn) block")


def load_bundle_specs(
    bundle_dir: Path, fixtures: Mapping[str, FixtureSpec]
) -> dict[str, BundleSpec]:
    """All bundle specs in ``bundle_dir`` keyed by name, in name order."""
    paths = sorted(bundle_dir.glob("*.json"), key=lambda p: p.stem)
    return {p.stem: load_bundle_spec(p, fixtures) for p in paths}
