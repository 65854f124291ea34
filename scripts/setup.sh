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

[ -x .venv/bin/python ] || python3 -m venv .venv
# Reinstall only when the dependency pins change.
stamp=.venv/.harness-deps
want=$(cat pyproject.toml harness/resources/constraints.txt | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  .venv/bin/python -m pip install -q --disable-pip-version-check -c harness/resources/constraints.txt -e '.[dev]'
  echo "$want" > "$stamp"
fi

# The Allure 3 CLI: reinstalled only when the lock file changes.
npm_stamp=node_modules/.harness-lock
npm_want=$(sha256sum package-lock.json | cut -d' ' -f1)
if [ "$(cat "$npm_stamp" 2>/dev/null)" != "$npm_want" ]; then
  npm ci --no-audit --no-fund --loglevel=error >/dev/null
  echo "$npm_want" > "$npm_stamp"
fi
