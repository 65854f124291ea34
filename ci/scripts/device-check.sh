#!/usr/bin/env bash
# The device check: the suites on a real NVIDIA GPU, on a machine with no Docker and no
# package registry (the lent H200 of docs/design.md), in one call of at most 5 minutes.
#
#   ci/scripts/device-check.sh            on the GPU machine, from the checkout's root
#   ci/scripts/device-check.sh --dry-run  here, on the CPU build: every step but the GPU
#
# What it needs beside the checkout is the bundle ci/scripts/device-pack.sh made
# (device-bundle/: llama-server.xz, ggml-rpc-server.xz, manifest.json, wheels/), carried
# with the call (`run` with carry ["device-bundle"]). It unpacks the binary, the RPC
# server beside it (when the bundle has one: the binary's probe records it as the
# build's RPC server) and the wheels (onto PYTHONPATH: no pip, no venv), puts the CUDA 13
# libraries of PyPI's nvidia-cublas and nvidia-cuda-runtime on the loader's path, writes
# the fixtures, and runs the suites with --harness-require-gpu cuda (so a GPU that does
# not answer fails instead of skipping): target and drafter on the GPU per block, plan
# forwarding with -ngl, MoE --n-cpu-moe with CUDA buffer sizes, a real out-of-memory
# start and the ladder's retreat, VRAM from NVML, speed figures, and the multi-device
# suite: a model spread over ggml-rpc-server processes on loopback (CPU-backed RPC
# devices, each capped) beside the GPU. It packs run.json, the Allure results and the
# startup logs into $OUT/device-check.tar.xz (at most 16 MiB: what one returned file
# may be).
#
# Settings (environment):
#   HARNESS_DEVICE_BUNDLE   the bundle folder (default device-bundle/)
#   HARNESS_DEVICE_WORK     scratch folder (default: a new temporary one)
#   HARNESS_DEVICE_WORKERS  xdist workers (default: cores / 2, at least 1)
#   HARNESS_DEVICE_BUDGET_S seconds the suites may take (default 240, so packing and a
#                         second call fit the device tool's limits)
#   OUT                   where the archive goes (the device tool sets it; default WORK)
#   HARNESS_DEVICE_SELECT   a pytest -k expression to narrow the run (e.g. for a rerun)
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
dry_run=""
[ "${1:-}" = --dry-run ] && dry_run=1
bundle=$(realpath "${HARNESS_DEVICE_BUNDLE:-device-bundle}")
work=${HARNESS_DEVICE_WORK:-$(mktemp -d -t harness-device-check.XXXXXX)}
mkdir -p "$work"
work=$(realpath "$work")
out=${OUT:-$work}
started=$(date +%s)
step() { echo "device-check: [$(($(date +%s) - started))s] $*" >&2; }
exec 2> >(tee -a "$work/device-check.log" >&2)

for need in "$bundle/llama-server.xz" "$bundle/manifest.json" "$bundle/wheels"; do
  if [ ! -e "$need" ]; then
    echo "device-check: $need is missing; make the bundle with ci/scripts/device-pack.sh" \
         "and carry it (device-bundle/)" >&2
    exit 2
  fi
done

step "unpacking the binary and $(ls "$bundle"/wheels | wc -l) wheels into $work"
python3 - "$bundle" "$work" <<'PY'
import hashlib, json, lzma, os, sys
bundle, work = sys.argv[1:]
manifest = json.load(open(os.path.join(bundle, "manifest.json")))
os.makedirs(os.path.join(work, "bin"), exist_ok=True)
# The RPC server goes beside llama-server, where a bare binary's probe finds it.
for entry, name in (("binary", "llama-server"), ("rpc_server", "ggml-rpc-server")):
    if entry not in manifest:
        continue
    packed = os.path.join(bundle, name + ".xz")
    if not os.path.isfile(packed):
        sys.exit(f"device-check: manifest.json names {entry} but {packed} is missing")
    data = lzma.decompress(open(packed, "rb").read())
    if hashlib.sha256(data).hexdigest() != manifest[entry]["sha256"]:
        sys.exit(f"device-check: {name}.xz does not match manifest.json's sha256")
    path = os.path.join(work, "bin", name)
    open(path, "wb").write(data)
    os.chmod(path, 0o755)
PY
export PYTHONPATH="$root:$work/site${PYTHONPATH:+:$PYTHONPATH}"
python3 -c 'import sys; sys.path.insert(0, sys.argv[1]); from harness.device_check import main; raise SystemExit(main(["unpack", "--wheels", sys.argv[2], "--site", sys.argv[3]]))' \
  "$root" "$bundle/wheels" "$work/site"
binary="$work/bin/llama-server"
if [ -x "$work/bin/ggml-rpc-server" ]; then
  step "RPC server: $work/bin/ggml-rpc-server (the multi-device suite's devices)"
else
  step "no RPC server in the bundle: the multi-device suite skips"
fi

# The CUDA 13 runtime and cuBLAS the binary links come from PyPI's nvidia-* wheels on
# that machine (nvidia/cu13/lib or nvidia/<name>/lib, depending on the wheel's age).
libs=$(python3 - <<'PY'
import glob, os, site, sys
roots = [*site.getsitepackages(), site.getusersitepackages(), *sys.path]
dirs = {os.path.dirname(p) for r in roots if r and os.path.isdir(r)
        for pattern in ("nvidia/*/lib/libcu*.so*", "nvidia/*/*/lib/libcu*.so*")
        for p in glob.glob(os.path.join(r, pattern))}
print(":".join(sorted(dirs)))
PY
)
[ -z "$libs" ] || export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
step "CUDA libraries from: ${libs:-none found (a CPU build needs none)}"
if ! "$binary" --version >"$work/version.txt" 2>&1; then
  echo "device-check: $binary --version failed:" >&2
  cat "$work/version.txt" >&2
  exit 1
fi
step "binary: $(grep -m1 version "$work/version.txt" || head -1 "$work/version.txt")"

export HARNESS_CACHE="$work/cache"
step "writing the fixtures"
python3 -c 'from harness.commands import main; main()' fixtures >/dev/null

cores=$(nproc)
workers=${HARNESS_DEVICE_WORKERS:-$(( cores / 2 > 0 ? cores / 2 : 1 ))}
# The dry run has no GPU to demand: it proves every other step on the CPU build.
require=cuda
[ -z "$dry_run" ] || require=""
suites=(suites/test_gpu_unused.py suites/test_plan_forwarding.py
        suites/test_offload_ladders.py suites/test_performance.py
        suites/test_smoke.py suites/test_numerics.py suites/test_multi_device.py)
step "suites (require GPU: ${require:-none}, $workers workers, budget ${HARNESS_DEVICE_BUDGET_S:-240}s)"
# The plugin is registered by the harness's entry point where it is installed; from the
# carried checkout it is named on the command line instead.
plugin=(-p harness.plugin.hooks)
python3 -c 'import importlib.metadata as m; m.distribution("harness")' 2>/dev/null && plugin=()
select=()
[ -z "${HARNESS_DEVICE_SELECT:-}" ] || select=(-k "$HARNESS_DEVICE_SELECT")
suites_rc=0
timeout --signal=INT --kill-after=20 "${HARNESS_DEVICE_BUDGET_S:-240}" \
  python3 -m pytest "${plugin[@]}" -p no:cacheprovider -n "$workers" -q -rs \
    --basetemp "$work/tmp" --alluredir "$work/allure-results" \
    --harness-build "$binary" --harness-run-record "$work/run.json" ${require:+--harness-require-gpu "$require"} \
    "${select[@]}" "${suites[@]}" 2>&1 | tee "$work/pytest.log" >&2 \
  || suites_rc=${PIPESTATUS[0]}
step "suites exited $suites_rc"

mkdir -p "$out"
python3 -c 'from harness.device_check import main; raise SystemExit(main())' \
  results --work "$work" --archive "$out/device-check.tar.xz"
cp "$work/pytest.log" "$out/pytest.log"
step "done: $out/device-check.tar.xz"
exit "$suites_rc"
