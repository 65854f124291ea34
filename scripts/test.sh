#!/usr/bin/env bash
# The project's tests: ruff, mypy, then pytest (unit tests and the suites against the
# real server) on two xdist workers. The server is built first so its progress shows
# here rather than inside a test's timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/harness build --backend cpu >/dev/null
.venv/bin/harness fixtures >/dev/null
# pytest exits 5 when it collected no tests; set -e makes that fail the run too.
exec .venv/bin/python -m pytest -n "${HARNESS_TEST_WORKERS:-2}" "$@"
