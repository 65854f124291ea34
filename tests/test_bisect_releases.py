"""``harness bisect`` over published releases (``release:N``), on real builds.

The endpoints are the two older releases the release matrix test builds (b10502 and
b10901), so in CI both are cache hits after it (or built here once, then hits for it).
The oracle's answer is known from the releases themselves: ``--mmproj-device`` is in the
``--help`` of b10603 and the pin and not in b10502's. ``--max-builds 0`` stops after the
endpoints, so what is checked is the range (every published version between, as
release:N), the release builds and the endpoints' verdicts — not seven more release
builds of about seven minutes each; a whole run over b10502..b10603 is in docs/bisect.md.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.releases.release_source import available_releases

HARNESS = [sys.executable, "-c", "from harness.commands import main; main()"]
LACKS_THE_FLAG = '! "$HARNESS_BISECT_BINARY" --help | grep -q -- --mmproj-device'


@pytest.mark.server
@pytest.mark.timeout(2400)
def test_a_release_range_judges_its_endpoints_and_lists_the_releases_between(
        tmp_path: Path) -> None:
    done = subprocess.run([*HARNESS, "bisect", "--good", "release:10502", "--bad",
                           "release:10901", "--script", LACKS_THE_FLAG, "--max-builds", "0",
                           "--out", str(tmp_path), "--json"],
                          capture_output=True, text=True, timeout=2300, check=False)
    assert done.returncode == 1, done.stderr  # candidates left: the builds allowed are spent
    result = json.loads(done.stdout)
    assert [(p["commit"], p["verdict"]) for p in result["probes"]] == [
        ("release:10502", "good"), ("release:10901", "bad")]
    between = [r for r in available_releases() if 10502 < r <= 10901]
    assert [c["sha"] for c in result["candidates"]] == [f"release:{r}" for r in between]
    assert result["stopped"].startswith("--max-builds 0 reached")
    assert result["candidates"][0]["subject"].startswith(f"llama.cpp b{between[0]} (")
