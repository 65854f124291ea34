#!/usr/bin/env bash
# Makes the bundle the device check carries to a GPU machine (device-bundle/ by default,
# git-ignored): the llama-server binary xz-compressed with its sha256, and wheels for
# every distribution the plugin imports except numpy (the machine has it), for its
# Python. Refuses a bundle over the 64 MiB one call carries.
#
#   ci/scripts/device-pack.sh [--binary PATH] [--out DIR] [--python X.Y]
#
# --binary   default: a native CUDA 13 build for sm_90 (`harness build --backend cuda
#            --cuda-arch 90 --reduced`; CUDA 13's nvcc and cuBLAS from the toolkit or
#            PyPI's nvidia-cublas, see harness doctor --backend cuda). The dry run in
#            tests/test_device_check.py passes the CPU build.
# --python   the GPU machine's Python (default 3.12); wheels are fetched for it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
binary="" out=device-bundle python_version=3.12
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) python_version=$2; shift 2 ;;
    *) echo "device-pack: unknown argument $1 (--binary, --out, --python)" >&2; exit 2 ;;
  esac
done
py=${HARNESS_PYTHON:-.venv/bin/python}
if [ -z "$binary" ]; then
  # GGML_CUDA_NO_VMM: a build host without a GPU driver has no libcuda to link the VMM
  # pool against (harness doctor --backend cuda says so); the legacy pool serves the check.
  binary=$(.venv/bin/harness build --backend cuda --cuda-arch 90 --reduced \
    --cmake-arg -DGGML_CUDA_NO_VMM=ON | tail -n 1)
fi
"$py" -m harness.device_check bundle --binary "$binary" --out "$out" --python "$python_version"
