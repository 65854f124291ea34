"""A fused bundle and its catalog entry, as the bundle's ``manifest.json`` states them.

Layout (documented in fixtures/models/README.md): ``<bundle>/manifest.json`` and
``<bundle>/text/<id>.gguf``, plus ``<bundle>/text/<id>-drafter.gguf`` when the entry
names a separate drafter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

MANIFEST_NAME = "manifest.json"


def text_model_relpath(entry_id: str) -> str:
    return f"text/{entry_id}.gguf"


def drafter_relpath(entry_id: str) -> str:
    return f"text/{entry_id}-drafter.gguf"


@dataclass(frozen=True)
class CatalogEntry:
    id: str
    runtime_class: str
    context_length: int
    cache_type_k: str
    cache_type_v: str
    #: The drafter file relative to the bundle root; None when there is none
    #: (no speculation, or an MTP head inside the text model).
    drafter: str | None
    spec_type: str | None
    tags: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        """The manifest object, keys in field order (the written bytes are hashed)."""
        data = asdict(self)
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
