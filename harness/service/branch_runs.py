"""Whether the results service holds a run of a branch: the nightly's first-night test.

``ci/scripts/nightly.sh`` compares a cell with its earlier nights only once there are
any, and asks here: ``python3 -m harness.service.branch_runs URL BRANCH`` exits 0 when
the service holds a run of BRANCH, 1 when it holds none or could not say (then with
one line naming the service, the call and why). The call is bounded like every other
service call (``service_client.py``).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from harness.errors import ServiceError
from harness.http_bounds import MIB
from harness.service.service_client import ServiceCall

TIMEOUT_S = 60.0
#: The listing of one run: a summary of a few hundred bytes.
MAX_BYTES = 1 * MIB


def has_runs(service: str, branch: str) -> bool:
    """Whether ``service`` lists a run of ``branch``; a ServiceError when it cannot say."""
    call = ServiceCall(service.rstrip("/"), "GET", "/api/runs", TIMEOUT_S, MAX_BYTES,
                       setting="HARNESS_SERVICE_URL")
    runs = call.json_object(call.send(params={"branch": branch, "limit": 1})).get("runs")
    if not isinstance(runs, list):
        raise call.error("sent no list of runs; is HARNESS_SERVICE_URL the address of "
                         "`harness serve`?")
    return bool(runs)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m harness.service.branch_runs URL BRANCH", file=sys.stderr)
        return 2
    service, branch = argv
    try:
        return 0 if has_runs(service, branch) else 1
    except ServiceError as exc:
        # The upload that follows fails too, and says why in full.
        print(f"nightly: cannot list {branch} runs: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
