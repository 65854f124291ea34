#!/usr/bin/env bash
# The main job: build the CPU llama-server (cached), write the GGUF fixtures and fetch
# the real model (cached), run the no-regression suites with Allure results, print a
# summary. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The real model the numerics suite uses where present (fetched once, sha256-checked).
.venv/bin/harness fixtures --real >/dev/null
exec .venv/bin/harness run "$@"
