#!/usr/bin/env bash
# One cell of the nightly matrix: the full suites (performance included) on one runner,
# for one fused bundle and one GPU config, uploaded to the results service so each cell
# keeps its own history, and compared with that cell's earlier nights.
#
#   ci/scripts/nightly.sh BACKEND BUNDLE GPU_CONFIG [PYTEST_ARGS...]
#
# BUNDLE is a bundle name (fused-dense, fused-mtp, or with HARNESS_BUNDLES=DIR one of
# your own, user:<folder>) or `all`; GPU_CONFIG a name from configs/gpu/*.json
# or `all`. Both are test selectors: tests parametrized by *another* bundle or card (their
# ids name it, e.g. test_bundle_plan_reaches_the_server[fused-mtp],
# test_card_flag_set_scaled_to_the_fixture[h200]) are deselected with -k; every other
# test runs in every cell. The cell's runs are recorded under the branch
# ${HARNESS_NIGHTLY_BRANCH:-nightly}/BUNDLE/GPU_CONFIG, so the service keeps one
# history per cell and hardware. The first night of a cell is stored, not compared.
#
# Everything else is ci/scripts/gate.sh (its settings apply; a -k among PYTEST_ARGS
# replaces the cell's selection, as pytest keeps the last -k).
set -euo pipefail

usage="usage: ci/scripts/nightly.sh BACKEND BUNDLE|all GPU_CONFIG|all [PYTEST_ARGS...]"
backend=${1:?$usage}
bundle=${2:?$usage}
config=${3:?$usage}
shift 3

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
if [ -x "$root/.venv/bin/harness" ]; then
  export PATH="$root/.venv/bin:$PATH"
fi

# The names the suites parametrize over, from the harness itself: the fixture bundles and
# those of the folder HARNESS_BUNDLES names (the plugin reads the same variable).
read -r -a bundles <<<"$(python3 -c 'import os
from pathlib import Path
from harness import modelgen
from harness.probes.bundle_folder import load_bundle_folder
folder = os.environ.get("HARNESS_BUNDLES")
print(*modelgen.BUNDLE_NAMES, *(load_bundle_folder(Path(folder)) if folder else ()))')"
read -r -a configs <<<"$(python3 -c 'from harness.probes.gpu_configs import load_gpu_configs
print(*sorted(c.name for c in load_gpu_configs()))')"

others=()
pick() {  # pick WHAT CHOSEN NAMES...: the names other than CHOSEN go to $others
  local what=$1 chosen=$2 name
  shift 2
  if [ "$chosen" = all ]; then
    return
  fi
  case " $* " in
    *" $chosen "*) ;;
    *) echo "nightly: unknown $what '$chosen'; known: $* (or all)" >&2; exit 2 ;;
  esac
  for name in "$@"; do
    if [ "$name" != "$chosen" ]; then others+=("$name"); fi
  done
}
pick bundle "$bundle" "${bundles[@]}"
pick "GPU config" "$config" "${configs[@]}"

selection=()
if ((${#others[@]})); then
  # Test ids spell the names with hyphens (parameters) or underscores (function names).
  terms=()
  for name in "${others[@]}"; do
    terms+=("$name")
    if [ "${name//-/_}" != "$name" ]; then terms+=("${name//-/_}"); fi
  done
  expression=$(printf ' or %s' "${terms[@]}")
  selection=(-k "not (${expression# or })")
fi

export HARNESS_BRANCH=${HARNESS_NIGHTLY_BRANCH:-nightly}/$bundle/$config
# The stale-card check (HARNESS_NIGHTLY_TUNE=1, gate.sh step 2c) tunes this cell's bundle.
export HARNESS_NIGHTLY_TUNE_BUNDLE=$bundle
# Compare with the cell's own earlier nights once there are any; the first night of a
# cell (or of a new GPU config) is its baseline.
export HARNESS_GATE_BASELINE=""
# Bounded like every call to the service: a stalled service is one line, not a hang.
if [ -n "${HARNESS_SERVICE_URL:-}" ] \
    && python3 -m harness.service.branch_runs "$HARNESS_SERVICE_URL" "$HARNESS_BRANCH"; then
  export HARNESS_GATE_BASELINE=$HARNESS_BRANCH
fi

exec "$here/gate.sh" "$backend" "${selection[@]}" "$@"
