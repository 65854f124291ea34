#!/usr/bin/env bash
# The main job: build the CPU llama-server (cached), write the GGUF fixtures, run the
# no-regression suites with Allure results, print a summary. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/harness run "$@"
