"""The exact Python pins in the packaged ``constraints.txt``.

The doctor compares the installed versions with them, and the device check carries
wheels at them; ``scripts/setup.sh`` installs with them (``pip install -c``).
"""

from __future__ import annotations

from pathlib import Path

from harness.resources import resource_path


def constraints_path() -> Path:
    return resource_path("constraints.txt")


def read_constraints(path: Path | None = None) -> dict[str, str]:
    """``name==version`` lines of constraints.txt, by normalized name; comments skipped."""
    text = (path or constraints_path()).read_text()
    pins = {}
    for line in text.splitlines():
        name, sep, version = line.split("#", 1)[0].strip().partition("==")
        if sep:
            pins[normal_name(name)] = version.strip()
    return pins


def normal_name(name: str) -> str:
    """PEP 503: runs of -, _ and . are one separator, and case does not count."""
    return "-".join(part for part in name.lower().replace("_", "-").replace(".", "-")
                    .split("-") if part)
