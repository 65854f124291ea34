"""ci/scripts/gate.sh copied into a bare checkout, with stand-ins for ``harness`` and
``python3`` first on PATH: how tests run the gate's own control flow (its settings, its
steps' order, its exit codes) without a build, a suite or a service behind it."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from checkout import REPO_ROOT

GATE = REPO_ROOT / "ci" / "scripts" / "gate.sh"


def bare_gate(tmp_path: Path, stand_in: str, files: Iterable[str] = ()) -> tuple[Path, Path]:
    """The copied gate.sh and the folder holding ``stand_in`` as ``harness`` and
    ``python3``. The copy lives in a checkout without .venv, so the gate does not put the
    real ones first on PATH; ``files`` are created empty in it (suite paths the gate checks)."""
    checkout = tmp_path / "checkout"
    (checkout / "ci" / "scripts").mkdir(parents=True)
    (checkout / "suites").mkdir()
    for name in files:
        (checkout / name).touch()
    script = checkout / "ci" / "scripts" / "gate.sh"
    script.write_text(GATE.read_text())
    script.chmod(0o755)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("harness", "python3"):
        (bin_dir / name).write_text(stand_in)
        (bin_dir / name).chmod(0o755)
    return script, bin_dir
