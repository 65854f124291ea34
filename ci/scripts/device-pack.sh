#!/usr/bin/env bash
# Makes the bundle the device check carries to a GPU machine (device-bundle/ by default,
# git-ignored): the llama-server binary and the RPC server (the multi-device suite's extra
# devices) xz-compressed with their sha256, and wheels for every distribution the plugin
# imports except numpy (the machine has it), for its Python. Refuses a bundle over the
# 64 MiB one call carries.
#
#   ci/scripts/device-pack.sh [--binary PATH] [--rpc-server PATH] [--out DIR] [--python X.Y]
#
# --binary      default: a native CUDA 13 build for sm_90 with the RPC backend (`harness
#               build --backend cuda --cuda-arch 90 --reduced --rpc`; CUDA 13's nvcc and
#               cuBLAS from the toolkit or PyPI's nvidia-cublas, see harness doctor
#               --backend cuda). The dry run in tests/test_device_check.py passes the CPU
#               RPC build.
# --rpc-server  default: with the default --binary, the CPU RPC build's ggml-rpc-server
#               (`harness build --backend cpu --rpc`); with --binary, the ggml-rpc-server
#               (or older rpc-server) beside it, else none (the multi-device suite then
#               skips, saying why).
# --python      the GPU machine's Python (default 3.12); wheels are fetched for it.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
binary="" rpc_server="" out=device-bundle python_version=3.12
while [ $# -gt 0 ]; do
  case $1 in
    --binary) binary=$2; shift 2 ;;
    --rpc-server) rpc_server=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --python) python_version=$2; shift 2 ;;
    *) echo "device-pack: unknown argument $1 (--binary, --rpc-server, --out, --python)" >&2
       exit 2 ;;
  esac
done
py=${HARNESS_PYTHON:-.venv/bin/python}
if [ -z "$binary" ]; then
  # GGML_CUDA_NO_VMM: a build host without a GPU driver has no libcuda to link the VMM
  # pool against (harness doctor --backend cuda says so); the legacy pool serves the check.
  # --rpc: llama-server's RPC client, so the multi-device suite can add RPC devices.
  binary=$(.venv/bin/harness build --backend cuda --cuda-arch 90 --reduced --rpc \
    --cmake-arg -DGGML_CUDA_NO_VMM=ON | tail -n 1)
  if [ -z "$rpc_server" ]; then
    # The RPC server carried is the CPU RPC build's: a CPU-backed RPC server is small
    # (no CUDA kernels to carry within the 64 MiB), and the split it proves is the GPU
    # (CUDA0) plus one RPC device, which llama.cpp orders first among the devices.
    cpu_binary=$(.venv/bin/harness build --backend cpu --rpc | tail -n 1)
    rpc_server=$(dirname "$cpu_binary")/ggml-rpc-server
  fi
elif [ -z "$rpc_server" ]; then
  for name in ggml-rpc-server rpc-server; do
    beside=$(dirname "$binary")/$name
    if [ -f "$beside" ] && [ -x "$beside" ]; then rpc_server=$beside; break; fi
  done
fi
"$py" -m harness.device_check bundle --binary "$binary" \
  ${rpc_server:+--rpc-server "$rpc_server"} --out "$out" --python "$python_version"
