"""What the nightly's stale-card check tunes: ``python3 -m harness.tune.nightly_target
BUNDLE`` prints the ``harness tune`` arguments, one per line (gate.sh step 2c reads them).

The cell's bundle (a fixture bundle by name; ``all`` or a name the fixtures lack: the
first fixture bundle) and, when this runner has a GPU, its name and memory, so the card
that matches it is the card checked. A runner without a GPU checks the plan the catalog
gives (no card applies there).
"""

from __future__ import annotations

import sys

from harness import modelgen
from harness.probes.hardware import detect_hardware


def target_args(bundle: str) -> list[str]:
    fixtures = modelgen.ensure_fixtures()
    name = bundle if bundle in modelgen.BUNDLE_NAMES else modelgen.BUNDLE_NAMES[0]
    args = ["--bundle", str(fixtures.bundle(name))]
    hardware = detect_hardware()
    if hardware.has_gpu and hardware.vram_mib:
        args += ["--gpu", hardware.gpu, "--vram-mib", str(hardware.vram_mib)]
    return args


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python3 -m harness.tune.nightly_target BUNDLE", file=sys.stderr)
        return 2
    print("\n".join(target_args(argv[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
