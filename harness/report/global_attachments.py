"""Files the Allure report shows beside the tests rather than in one of them.

Allure 3 reads ``*-globals.json`` files in the results folder: each lists attachments
(name, the file in the folder, its type) that the report's front page shows as global
attachments. ``generate_report`` writes them into its staged copy of the results, so
the folder the user gave is never changed.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class GlobalAttachment:
    """A file the report shows beside the tests, not in any one of them (Allure 3's
    global attachments: a ``*-globals.json`` naming files in the results folder)."""

    name: str
    data: bytes
    mime: str
    extension: str


def write_global_attachments(results_dir: Path, attachments: Sequence[GlobalAttachment],
                             now_ms: int) -> None:
    """Put ``attachments`` and the globals file that lists them into ``results_dir``."""
    listed = []
    for attachment in attachments:
        source = f"{uuid.uuid4()}-attachment.{attachment.extension}"
        (results_dir / source).write_bytes(attachment.data)
        listed.append({"name": attachment.name, "source": source, "type": attachment.mime,
                       "timestamp": now_ms})
    if listed:
        (results_dir / f"{uuid.uuid4()}-globals.json").write_text(
            json.dumps({"attachments": listed, "errors": []}))
