"""A fused bundle and its catalog entry, as the bundle's ``manifest.json`` states them.

Layout (documented in fixtures/models/README.md): ``<bundle>/manifest.json`` and
``<bundle>/text/<id>.gguf``, plus ``<bundle>/text/<id>-drafter.gguf`` when the entry
names a separate drafter.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"


class RuntimeClass(enum.StrEnum):
    """A catalog entry's ``runtime_class``: the runtime its model needs.

    The catalog format's words (fixtures/models/README.md; the production catalog the
    harness models calls it ``fused-eliza1``: reference 000, docs/references.md). A fused
    entry goes to the fused llama-cpp pipeline (harness/planning/routing.py), and it is
    the only class the runtime ships.
    """

    FUSED = "fused"


def parse_runtime_class(word: object) -> RuntimeClass:
    """A manifest's or bundle spec's ``runtime_class``; ValueError names the known ones."""
    for runtime_class in RuntimeClass:
        if word == runtime_class.value:
            return runtime_class
    raise ValueError(f"runtime_class {word!r} is not one of "
                     f"{', '.join(repr(r.value) for r in RuntimeClass)}")


def text_model_relpath(entry_id: str) -> str:
    return f"text/{entry_id}.gguf"


def drafter_relpath(entry_id: str) -> str:
    return f"text/{entry_id}-drafter.gguf"


#: llama-server's ``--spec-type`` value for no speculative decoding.
NO_SPECULATION = "none"


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    runtime_class: RuntimeClass
    context_length: int
    cache_type_k: str
    cache_type_v: str
    #: The drafter file relative to the bundle root; None when there is none
    #: (no speculation, or an MTP head inside the text model).
    drafter: str | None
    spec_type: str | None
    tags: tuple[str, ...]

    def __post_init__(self) -> None:
        # The entry is where a manifest's (harness/probes/bundles.py) and a bundle spec's
        # (harness/modelgen/bundle_layout.py) runtime class arrive as text: an unknown one is
        # refused here, whoever built the entry.
        object.__setattr__(self, "runtime_class", parse_runtime_class(self.runtime_class))
        # llama-server's own word for no speculation (``--spec-type none``) and the
        # manifest's null are one value: no speculation, read once here as None.
        if self.spec_type == NO_SPECULATION:
            object.__setattr__(self, "spec_type", None)

    def to_json(self) -> dict[str, Any]:
        """The manifest object, keys in field order (the written bytes are hashed)."""
        data = asdict(self)
        data["runtime_class"] = self.runtime_class.value
        data["tags"] = list(self.tags)
        return data


@dataclass(frozen=True)
class Bundle:
    root: Path
    entry: CatalogEntry

    @property
    def text_model(self) -> Path:
        return self.root / text_model_relpath(self.entry.id)

    @property
    def drafter_path(self) -> Path | None:
        return self.root / self.entry.drafter if self.entry.drafter else None
