"""Fused bundle specs: which fixtures make up a bundle and the catalog entry it carries.

One JSON file per bundle under ``fixtures/models/bundles/``; the bundle's name is the
file's stem. Keys and types are resources/schemas/bundle-spec.schema.json's; model and drafter
refer to fixture names, checked here against the fixture specs.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.data_schema import fail_if_any, load_json, problem, schema_file
from harness.errors import FixtureError, UnknownFixtureError
from harness.facts.catalog import RuntimeClass
from harness.modelgen.specs import FixtureSpec


class SpecType(enum.StrEnum):
    """Speculative types a bundle may declare; values are llama-server's ``--spec-type``."""

    DRAFT_SIMPLE = "draft-simple"
    DRAFT_MTP = "draft-mtp"


#: The bundle spec format; its cache types are the stock server's (STOCK_CACHE_TYPES),
#: since a bundle runs on the stock server the fixtures test.
SCHEMA = schema_file("bundle-spec")
_FIX = "fixtures/models/README.md describes the bundle specs"


@dataclass(frozen=True)
class BundleSpec:
    name: str
    description: str
    path: Path
    id: str
    model: str
    drafter: str | None
    runtime_class: RuntimeClass
    context_length: int
    cache_type_k: str
    cache_type_v: str
    spec_type: SpecType
    tags: tuple[str, ...]


def load_bundle_spec(path: Path, fixtures: Mapping[str, FixtureSpec]) -> BundleSpec:
    obj: Mapping[str, Any] = load_json(path, SCHEMA, FixtureError, fix=_FIX)
    spec = BundleSpec(
        name=path.stem,
        description=obj["description"],
        path=path,
        id=obj["id"],
        model=obj["model"],
        drafter=obj["drafter"],
        runtime_class=RuntimeClass(obj["runtime_class"]),
        context_length=int(obj["context_length"]),
        cache_type_k=obj["cache_type_k"],
        cache_type_v=obj["cache_type_v"],
        spec_type=SpecType(obj["spec_type"]),
        tags=tuple(obj.get("tags", ())),
    )
    _check_fixtures(spec, fixtures)
    return spec


def _check_fixtures(spec: BundleSpec, fixtures: Mapping[str, FixtureSpec]) -> None:
    """What the schema cannot know: the fixtures the bundle names, and what they are."""
    models = [name for name, fixture in fixtures.items() if fixture.shape is not None]
    allowed = f"one of {', '.join(json.dumps(n) for n in models)} (the model fixtures)"
    every = f"one of {', '.join(json.dumps(n) for n in fixtures)} (the fixtures), or null"
    unknown = [problem(spec.path, f"$.{role}", name, "not a fixture", choices)
               for role, name, choices in (("model", spec.model, allowed),
                                           ("drafter", spec.drafter, every))
               if name is not None and name not in fixtures]
    fail_if_any(UnknownFixtureError, unknown, _FIX)
    model = fixtures[spec.model].shape
    if model is None:
        fail_if_any(FixtureError, [problem(spec.path, "$.model", spec.model,
                                           "a truncated copy, not a generated model", allowed)])
    elif spec.spec_type is SpecType.DRAFT_MTP and model.nextn_predict_layers == 0:
        fail_if_any(FixtureError, [problem(
            spec.path, "$.model", spec.model, "spec_type draft-mtp needs a model with an MTP "
            "(nextn) block, and it has none", "a model fixture with nextn_predict_layers 1")])


def load_bundle_specs(
    bundle_dir: Path, fixtures: Mapping[str, FixtureSpec]
) -> dict[str, BundleSpec]:
    """All bundle specs in ``bundle_dir`` keyed by name, in name order."""
    paths = sorted(bundle_dir.glob("*.json"), key=lambda p: p.stem)
    return {p.stem: load_bundle_spec(p, fixtures) for p in paths}
