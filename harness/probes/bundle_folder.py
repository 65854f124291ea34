"""A folder of the user's own fused bundles (``--harness-bundles DIR``), read strictly.

Every subfolder is one bundle in the layout the fixtures' bundles use
(fixtures/models/README.md): the catalog entry in ``manifest.json`` (checked
against its JSON Schema), the text model at ``text/<id>.gguf`` and the drafter the entry
names. All subfolders are read and every problem is reported at once, each naming its
file and key; a hidden folder (``.git``) is not a bundle. Nothing is downloaded: the
folder is the user's.

A user bundle is known to the suites as ``user:<folder name>``, so it can never be taken
for one of the fixture bundles, and its test ids say whose it is.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType

from harness.errors import ConfigError, HarnessError
from harness.facts.catalog import MANIFEST_NAME, Bundle
from harness.probes.bundles import load_bundle

USER_PREFIX = "user:"
LAYOUT_FIX = ("each bundle is a folder with manifest.json (the catalog entry) and text/ "
              "(text/<id>.gguf and the drafter it names); "
              "fixtures/models/README.md describes the layout")


def user_bundle_id(folder_name: str) -> str:
    return USER_PREFIX + folder_name


def load_bundle_folder(root: Path) -> MappingProxyType[str, Bundle]:
    """``user:<name>`` → the bundle, for every subfolder of ``root``, sorted by name.

    Raises ConfigError listing every subfolder that is not a readable bundle, or saying
    that ``root`` holds none.
    """
    if not root.is_dir():
        raise ConfigError(f"{root}: no such folder; give a folder whose subfolders are "
                          f"bundles ({LAYOUT_FIX})")
    found: dict[str, Bundle] = {}
    problems: list[str] = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir()
                         and not p.name.startswith(".")):
        if not (folder / MANIFEST_NAME).is_file():
            problems.append(f"{folder}: no {MANIFEST_NAME}")
            continue
        try:
            # The layout is said once, after every problem.
            found[user_bundle_id(folder.name)] = load_bundle(folder, fix="", missing_fix="")
        except HarnessError as exc:
            problems.append(str(exc))
    if problems:
        listed = "\n".join(problems)
        raise ConfigError(f"{root}: {len(problems)} of its folders are not bundles:\n"
                          f"{listed}\n{LAYOUT_FIX}")
    if not found:
        raise ConfigError(f"{root} holds no bundle folder; {LAYOUT_FIX}")
    return MappingProxyType(found)
