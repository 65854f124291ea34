#!/usr/bin/env bash
# Prepares a checkout to run: Debian packages a fresh machine may lack, the virtual
# environment with the pinned Python dependencies, and the pinned Allure 3 report
# generator (npm, package-lock.json). Safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

missing=()
command -v c++ >/dev/null || missing+=(g++)
command -v make >/dev/null || command -v ninja >/dev/null || missing+=(make)
python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)
command -v npm >/dev/null || missing+=(nodejs npm)
# GNU patch applies the slowed build's patch (harness/builds/slowed.py: A/B tests).
command -v patch >/dev/null || missing+=(patch)
# ccache lets builds of nearby sources share objects (harness/builds/compiler_cache.py:
# the slowed build recompiles 3 files, not 400). Optional: without root it is only named.
if ! command -v ccache >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    missing+=(ccache)
  else
    echo "setup: no ccache; builds compile every file (apt-get install ccache)" >&2
  fi
fi
if ((${#missing[@]})); then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  else
    echo "setup: missing ${missing[*]}; install them with: apt-get install ${missing[*]}" >&2
    exit 1
  fi
fi

# .venv: the editable harness on top of one environment of the pinned dependencies that
# every checkout shares (made once per set of pins in $HARNESS_CACHE/venvs; a fresh clone's
# .venv then takes about 2 s, not 45). HARNESS_SHARED_VENV=off installs all into .venv.
python3 scripts/checkout_venv.py

# The Allure 3 CLI: reinstalled only when the lock file changes.
npm_stamp=node_modules/.harness-lock
npm_want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_want" ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  echo "$npm_want" > "$npm_stamp"
fi
