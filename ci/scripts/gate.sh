#!/usr/bin/env bash
# The gate job, the same on GitHub Actions, GitLab CI and a developer's shell:
#
#   ci/scripts/gate.sh BACKEND [PYTEST_ARGS...]      BACKEND: cpu, cuda, rocm or vulkan
#
# 1. builds llama-server for BACKEND (cached by build key: a hit costs about a second),
# 2. runs the suites (HARNESS_GATE_SUITES, default suites/) against it with Allure
#    results and a run record,
# 3. renders the one-file Allure report (the CI artifact),
#    with HARNESS_GATE_AB_BASELINE set, measures it against a baseline build side by
#    side (`harness ab`),
# 4. with HARNESS_SERVICE_URL set, uploads the run to the results service and
# 5. compares it there with the baseline branch's runs on the same hardware, writing
#    the markdown to the step summary.
#
# It exits non-zero when a suite test fails, when the comparison finds a regression
# (exit 1) or cannot be made (exit 2), when the A/B stays undecided (exit 3, see
# HARNESS_GATE_AB_UNDECIDED), or when a step breaks; every step that can still run
# after a failure runs, so the report and the upload exist for a red run.
#
# Settings (environment; the workflows set them, a shell may leave them unset):
#   HARNESS_GATE_RUNNER   container (default; what CI runs) or subprocess (a native build
#                         run as child processes: no Docker needed, how tests/ runs it)
#   HARNESS_GATE_BASE     container only, where the base images come from: local
#                         (`harness base-image --backend B`, Debian hosts: debian:13 for
#                         cpu/vulkan, debian:13 with non-free for cuda, debian:sid for
#                         rocm; default for cpu/vulkan), pull (`docker pull` of the
#                         Dockerfile's default bases, NVIDIA's/AMD's images, for runners
#                         with registry access) or present (already on the engine;
#                         default for cuda/rocm)
#   HARNESS_GATE_BUILD_ARGS  extra `harness build` options, a word list (e.g.
#                         "--cuda-arch 89", "--amdgpu-targets gfx1100", "--reduced")
#   HARNESS_GATE_OUT      output folder (default: harness-gate/ in the checkout):
#                         allure-results/, run.json, report/index.html, summary.md
#   HARNESS_GATE_BASELINE baseline selector for the comparison (default main); empty:
#                         no comparison (a baseline run on main itself)
#   HARNESS_GATE_SUMMARY  where the comparison's markdown goes (default:
#                         $GITHUB_STEP_SUMMARY, else $HARNESS_GATE_OUT/summary.md)
#   HARNESS_GATE_WORKERS  pytest-xdist workers (default auto)
#   HARNESS_GATE_WINDOW, HARNESS_GATE_MIN_RUNS   the comparison's --window/--min-runs
#                         (unset: `harness compare`'s own defaults, which
#                         harness/results/rules.py holds; raise both on a noisy runner,
#                         see docs/results.md)
#   HARNESS_GATE_REQUIRE_GPU  1 (default for GPU backends): the run fails instead of
#                         skipping when the build sees no device of BACKEND
#   HARNESS_GATE_GPU_COUNT  how many devices of BACKEND the run needs (default 1), a
#                         whole number of 1 or more: above 1, the requirement above
#                         demands BACKEND:N (e.g. cuda:2), so a multi-GPU runner whose
#                         build lists fewer fails instead of skipping; not used for cpu
#                         or with HARNESS_GATE_REQUIRE_GPU=0
#   HARNESS_GATE_SUITES   the pytest paths the gate runs, a word list (default suites;
#                         e.g. "suites/test_multi_device.py", the multi-GPU cell's)
#   HARNESS_GATE_AB_BASELINE  pin, or a git ref of the llama.cpp checkout in
#                         HARNESS_SOURCE: that source is built (a cache hit when it was
#                         built before) and `harness ab` measures the build under test
#                         against it side by side; the result goes into run.json as its
#                         `ab` object and a regression fails the job (exit 1). Unset: no A/B
#   HARNESS_GATE_AB_ARGS  extra `harness ab` options, a word list (e.g. "--budget-s 120
#                         --metric decode_tps")
#   HARNESS_GATE_AB_UNDECIDED  what an undecided A/B (`harness ab` exit 3: nothing
#                         regressed, a metric still unknown) does to the job: rerun
#                         (default: `harness ab` once more with the same arguments and a
#                         fresh budget, its result replacing the first in run.json and
#                         appended to ab.txt; undecided again fails the job, exit 3), fail
#                         (exit 3 at once) or neutral (the job does not fail on it). A
#                         merge gate's green reads as a pass, so the default spends one
#                         more budget and then fails rather than pass an undecided A/B.
#                         Whatever the setting, an undecided A/B adds an "A/B undecided"
#                         section to the summary with the table's undecided lines
#   HARNESS_NIGHTLY_TUNE  1: the stale-card check (`harness tune --check`) of the card's
#                         plan on the build under test, added to run.json as its `tune`
#                         object before the upload; a stale card is a warning in the
#                         summary and on the dashboard, never a failure
#   HARNESS_NIGHTLY_TUNE_ARGS  extra `harness tune` options, a word list (e.g. "--vary
#                         kv,batch --budget-s 300"); a --model or --bundle there replaces
#                         the cell's bundle (HARNESS_NIGHTLY_TUNE_BUNDLE, set by nightly.sh)
#   HARNESS_SERVICE_URL   the results service; unset: no upload, no comparison
#   HARNESS_SERVICE_TOKEN its upload token: environment only, never an argument
#   HARNESS_SOURCE        a llama.cpp tree to build instead of the pinned source
#   HARNESS_BUNDLES       a folder of your own fused bundles: the suites parametrized
#                         over bundles run over them too (read by the plugin; the same
#                         as passing --harness-bundles DIR among the pytest arguments)
#   HARNESS_BRANCH, HARNESS_COMMIT, HARNESS_RUN_ID   what the run is recorded as;
#                         default: from the CI's variables, and a fresh run id
set -euo pipefail

backend=${1:?usage: ci/scripts/gate.sh BACKEND [PYTEST_ARGS...] (BACKEND: cpu, cuda, rocm, vulkan)}
shift
case $backend in
  cpu | cuda | rocm | vulkan) ;;
  *) echo "gate: unknown backend '$backend'; use cpu, cuda, rocm or vulkan" >&2; exit 2 ;;
esac

root=$(cd "$(dirname "$0")/../.." && pwd)
# The checkout's virtual environment (scripts/setup.sh) when there is one; otherwise
# the harness is pip-installed and `harness` is already on PATH.
if [ -x "$root/.venv/bin/harness" ]; then
  export PATH="$root/.venv/bin:$PATH"
fi

runner=${HARNESS_GATE_RUNNER:-container}
out=${HARNESS_GATE_OUT:-$root/harness-gate}
mkdir -p "$out"
out=$(cd "$out" && pwd)
baseline=${HARNESS_GATE_BASELINE-main}
summary=${HARNESS_GATE_SUMMARY:-${GITHUB_STEP_SUMMARY:-$out/summary.md}}
workers=${HARNESS_GATE_WORKERS:-auto}
gpu_count=${HARNESS_GATE_GPU_COUNT:-1}
# shellcheck disable=SC2206  # a word list on purpose
suite_paths=(${HARNESS_GATE_SUITES:-suites})
# Passed on only when set, so the compare CLI's defaults (harness/results/rules.py) are
# the one copy of the noise rule's.
noise_args=()
[ -z "${HARNESS_GATE_WINDOW:-}" ] || noise_args+=(--window "$HARNESS_GATE_WINDOW")
[ -z "${HARNESS_GATE_MIN_RUNS:-}" ] || noise_args+=(--min-runs "$HARNESS_GATE_MIN_RUNS")
service=${HARNESS_SERVICE_URL:-}
results=$out/allure-results
run_json=$out/run.json
report=$out/report

# What the run is recorded as. The harness reads the CI's own variables too; naming
# them here keeps GitHub's pull-request head and GitLab's merge-request source first.
branch=${HARNESS_BRANCH:-${GITHUB_HEAD_REF:-${CI_MERGE_REQUEST_SOURCE_BRANCH_NAME:-${GITHUB_REF_NAME:-${CI_COMMIT_REF_NAME:-}}}}}
[ -z "$branch" ] || export HARNESS_BRANCH=$branch
commit=${HARNESS_COMMIT:-${CI_MERGE_REQUEST_SOURCE_BRANCH_SHA:-${CI_COMMIT_SHA:-${GITHUB_SHA:-}}}}
[ -z "$commit" ] || export HARNESS_COMMIT=$commit
# Named here rather than by the plugin, so the upload and the comparison know it.
random=$(od -An -N4 -tx1 /dev/urandom | tr -d ' \n')
export HARNESS_RUN_ID=${HARNESS_RUN_ID:-$(date -u +%Y%m%dT%H%M%SZ)-$backend-$random}
echo "$HARNESS_RUN_ID" >"$out/run-id"
echo "gate: run $HARNESS_RUN_ID, $backend, runner $runner, branch ${HARNESS_BRANCH:-(from git)}" >&2

# Settings that cannot work are refused before anything is built or run, so a job
# set up wrongly fails in seconds, not after its suites.
ab_baseline=${HARNESS_GATE_AB_BASELINE:-}
if [ -n "$ab_baseline" ] && [ "$ab_baseline" != pin ] && [ -z "${HARNESS_SOURCE:-}" ]; then
  echo "gate: HARNESS_GATE_AB_BASELINE=$ab_baseline is a git ref, which needs" \
       "HARNESS_SOURCE (the llama.cpp checkout it is a ref of); or use pin" >&2
  exit 2
fi
ab_undecided=${HARNESS_GATE_AB_UNDECIDED:-rerun}
case $ab_undecided in
  rerun | fail | neutral) ;;
  *) echo "gate: HARNESS_GATE_AB_UNDECIDED must be rerun, fail or neutral (what an" \
          "undecided A/B does to the job), not '$ab_undecided'" >&2
     exit 2 ;;
esac
if ! [[ $gpu_count =~ ^[1-9][0-9]*$ ]]; then
  echo "gate: HARNESS_GATE_GPU_COUNT must be a whole number of 1 or more (the devices" \
       "of BACKEND the run needs), not '$gpu_count'" >&2
  exit 2
fi
for suite in "${suite_paths[@]}"; do
  # Relative to the checkout, where pytest runs; a node id (suites/test_x.py::test_y)
  # names its file before the "::".
  case $suite in /*) file=${suite%%::*} ;; *) file=$root/${suite%%::*} ;; esac
  if [ ! -e "$file" ]; then
    echo "gate: HARNESS_GATE_SUITES names '$suite', which is no path in the checkout" >&2
    exit 2
  fi
done

# -- 1. the build under test ------------------------------------------------------
run_args=(--harness-runner "$runner")
# shellcheck disable=SC2206  # a word list on purpose
build_args=(${HARNESS_GATE_BUILD_ARGS:-})
if [ "$runner" = container ]; then
  case ${HARNESS_GATE_BASE:-} in
    local | "")
      if [ "$backend" = cpu ] || [ "$backend" = vulkan ]; then
        harness base-image --backend "$backend" >/dev/null
      elif [ -n "${HARNESS_GATE_BASE:-}" ]; then
        # CUDA and ROCm build from Debian's own toolkits on a local base.
        harness base-image --backend "$backend" >/dev/null
        build_args+=(--base local)
      fi
      ;;
    pull)
      # The bases the Dockerfile defaults to, as the harness names them.
      for image in $(python3 -c 'import sys
from harness.facts.build import Backend
from harness.planning.container_plan import DEFAULT_BASES
print(*sorted(set(DEFAULT_BASES[Backend(sys.argv[1])].values())))' "$backend"); do
        docker pull --quiet "$image"
      done
      ;;
    present) ;;
    *) echo "gate: HARNESS_GATE_BASE must be local, pull or present" >&2; exit 2 ;;
  esac
  # The last line on stdout is the image tag, harness/llama-server:<build key>.
  image=$(harness build --backend "$backend" --container "${build_args[@]}" | tail -n 1)
  run_args+=(--harness-image "$image" --harness-build "${image##*:}")
elif [ "$runner" = subprocess ]; then
  # The last line on stdout is the binary; its build.json lies beside it.
  binary=$(harness build --backend "$backend" "${build_args[@]}" | tail -n 1)
  run_args+=(--harness-build "$binary")
else
  echo "gate: HARNESS_GATE_RUNNER must be container or subprocess, not '$runner'" >&2
  exit 2
fi
if [ "$backend" != cpu ] && [ "${HARNESS_GATE_REQUIRE_GPU:-1}" = 1 ]; then
  if [ "$gpu_count" = 1 ]; then
    run_args+=(--harness-require-gpu "$backend")
  else
    run_args+=(--harness-require-gpu "$backend:$gpu_count")
  fi
fi

# -- 2. the suites ------------------------------------------------------------------
rm -f "$run_json"
suites_rc=0
(cd "$root" && python3 -m pytest "${suite_paths[@]}" -p no:cacheprovider -n "$workers" \
  --alluredir "$results" --clean-alluredir --harness-run-record "$run_json" \
  "${run_args[@]}" "$@") || suites_rc=$?
echo "gate: suites exit $suites_rc" >&2

# -- 2b. the paired A/B against a baseline build ------------------------------------
ab_rc=0
# An output folder used before must not carry an earlier job's undecided section.
rm -f "$out/ab-undecided.md" "$out/ab-last.txt"
if [ -n "$ab_baseline" ]; then
  if [ "$runner" = container ]; then candidate=$image; else candidate=$binary; fi
  ab_source=()
  if [ "$ab_baseline" != pin ]; then
    ab_tree=$out/ab-baseline-source
    rm -rf "$ab_tree"
    mkdir -p "$ab_tree"
    # The ref's files only: the build is keyed by their content, so a ref built before
    # is a cache hit.
    git -C "$HARNESS_SOURCE" archive "$ab_baseline" | tar -x -C "$ab_tree"
    ab_source=(--source "$ab_tree")
  fi
  # Without --source and HARNESS_SOURCE, `harness build` builds the pinned source.
  ab_build=(env -u HARNESS_SOURCE harness build --backend "$backend" "${build_args[@]}" "${ab_source[@]}")
  if [ "$runner" = container ]; then ab_build+=(--container); fi
  ab_base=$("${ab_build[@]}" | tail -n 1)
  ab_record=()
  if [ -f "$run_json" ]; then ab_record=(--record "$run_json"); fi
  # shellcheck disable=SC2206  # a word list on purpose
  ab_args=(${HARNESS_GATE_AB_ARGS:-})
  # Into run.json (uploaded below) and into the report as one more result.
  ab_command=(harness ab --baseline "$ab_base" --candidate "$candidate" "${ab_record[@]}"
              --allure-results "$results" "${ab_args[@]}")
  : >"$out/ab.txt"
  # One comparison: its table in ab-last.txt (where the undecided lines are read) and
  # appended to ab.txt, which keeps every attempt's.
  ab_attempt() {
    local rc=0
    "${ab_command[@]}" | tee "$out/ab-last.txt" || rc=${PIPESTATUS[0]}
    cat "$out/ab-last.txt" >>"$out/ab.txt"
    return "$rc"
  }
  ab_attempt || ab_rc=$?
  ab_first_rc=$ab_rc
  if [ "$ab_rc" = 3 ] && [ "$ab_undecided" = rerun ]; then
    # The same arguments and a fresh budget. `harness ab --record` replaces the first
    # result's `ab` in run.json (and says so); the Allure results keep both, under the
    # comparison's one history id.
    echo "gate: A/B undecided; HARNESS_GATE_AB_UNDECIDED=rerun: once more" >&2
    printf '\n--- undecided: rerun (HARNESS_GATE_AB_UNDECIDED=rerun), its result replaces the one above ---\n\n' \
      >>"$out/ab.txt"
    ab_rc=0
    ab_attempt || ab_rc=$?
  fi
  echo "gate: A/B against $ab_baseline exit $ab_rc" >&2
  if [ "$ab_rc" = 3 ]; then
    # Written into the summary at the end: `harness compare --output` replaces it.
    case $ab_undecided in
      rerun) ab_policy="undecided twice (HARNESS_GATE_AB_UNDECIDED=rerun): the job fails (exit 3)" ;;
      fail) ab_policy="HARNESS_GATE_AB_UNDECIDED=fail: the job fails (exit 3)" ;;
      neutral) ab_policy="HARNESS_GATE_AB_UNDECIDED=neutral: the job does not fail on it" ;;
    esac
    { printf '\n### A/B undecided\n\n'
      printf 'The paired A/B against `%s` found no regression but could not rule one out; %s. Every table is in ab.txt.\n\n```\n' \
        "$ab_baseline" "$ab_policy"
      grep '^undecided:' "$out/ab-last.txt" || echo "(no undecided lines: see ab.txt)"
      printf '```\n'; } >"$out/ab-undecided.md"
    if [ "$ab_undecided" = neutral ]; then ab_rc=0; fi
  elif [ "$ab_first_rc" = 3 ]; then
    { printf '\n### A/B undecided, then decided\n\n'
      printf 'The first A/B against `%s` was undecided; its rerun (HARNESS_GATE_AB_UNDECIDED=rerun) exited %s. Both tables are in ab.txt.\n' \
        "$ab_baseline" "$ab_rc"; } >"$out/ab-undecided.md"
  fi
fi

# -- 2c. the nightly's stale-card check ------------------------------------------------
# Before the upload, so the run the service stores carries it. A stale card (a candidate
# beat the card's plan) is reported, not failed; a tune that cannot run is said and the
# job goes on.
if [ "${HARNESS_NIGHTLY_TUNE:-0}" = 1 ] && [ -f "$run_json" ]; then
  tune_rc=0
  # shellcheck disable=SC2206  # a word list on purpose
  tune_args=(${HARNESS_NIGHTLY_TUNE_ARGS:-})
  case " ${tune_args[*]} " in
    *" --model "* | *" --bundle "*) ;;
    *) mapfile -t target < <(python3 -m harness.tune.nightly_target \
         "${HARNESS_NIGHTLY_TUNE_BUNDLE:-all}")
       tune_args=("${target[@]}" "${tune_args[@]}") ;;
  esac
  if [ "$runner" = container ]; then tune_build=${image##*:}; else tune_build=$binary; fi
  harness tune --check --record "$run_json" --build "$tune_build" "${tune_args[@]}" \
    >"$out/tune.txt" 2>&1 || tune_rc=$?
  if grep -q '^stale card' "$out/tune.txt"; then
    { printf '\n### Stale card\n\n```\n'; grep '^stale card' "$out/tune.txt"
      printf '```\n'; } >>"$summary"
  fi
  echo "gate: stale-card check exit $tune_rc (a warning at most; $out/tune.txt)" >&2
fi

# -- 3. the report artifact -----------------------------------------------------------
# Its own history file: the runner's shared one would mix branches into the trend (the
# service keeps one trend per branch and hardware).
report_rc=0
rm -f "$out/allure-history.jsonl"
harness report --results "$results" --output "$report" \
  --history "$out/allure-history.jsonl" --single-file || report_rc=$?

# -- 4. and 5. the results service ----------------------------------------------------
upload_rc=0
compare_rc=0
if [ -z "$service" ]; then
  echo "gate: HARNESS_SERVICE_URL is not set: the run is not uploaded or compared" >&2
  printf '## Gate: %s\n\nRun `%s`: suites exit %s; no results service configured, so no comparison.\n' \
    "$backend" "$HARNESS_RUN_ID" "$suites_rc" >>"$summary"
elif [ ! -f "$run_json" ]; then
  echo "gate: pytest wrote no run record ($run_json): nothing to upload" >&2
  upload_rc=1
else
  harness upload --url "$service" --run-json "$run_json" --results "$results" || upload_rc=$?
  if [ "$upload_rc" = 0 ] && [ -n "$baseline" ]; then
    harness compare --service "$service" --baseline "$baseline" --current "$HARNESS_RUN_ID" \
      "${noise_args[@]}" --output "$summary" || compare_rc=$?
  elif [ "$upload_rc" = 0 ]; then
    printf '## Gate: %s\n\nRun `%s` stored as a baseline (suites exit %s); not compared.\n' \
      "$backend" "$HARNESS_RUN_ID" "$suites_rc" >>"$summary"
  fi
fi

# -- 6. the nightly's bisect: the commit behind a regression ------------------------
# HARNESS_NIGHTLY_BISECT=1: when the comparison found a regression, bisect between the
# newest baseline run's commit and this run's (their source.commit labels: builds from a
# clean checkout at HARNESS_SOURCE) and attach the culprit to this run in the service.
# It explains the red job; it does not change its exit status.
if [ "${HARNESS_NIGHTLY_BISECT:-0}" = 1 ] && [ "$compare_rc" = 1 ]; then
  bisect_rc=0
  if [ -z "${HARNESS_SOURCE:-}" ]; then
    echo "gate: HARNESS_NIGHTLY_BISECT=1 needs HARNESS_SOURCE, the llama.cpp checkout" \
         "the runs were built from" >&2
    bisect_rc=2
  else
    # shellcheck disable=SC2206  # a word list on purpose
    bisect_args=(${HARNESS_NIGHTLY_BISECT_ARGS:-})
    python3 -m harness.bisect.nightly --service "$service" --run "$HARNESS_RUN_ID" \
      --baseline "$baseline" --source "$HARNESS_SOURCE" --out "$out/bisect" \
      -- "${bisect_args[@]}" || bisect_rc=$?
    if [ -f "$out/bisect/table.md" ]; then
      printf '\n### Bisect\n\n' >>"$summary"
      cat "$out/bisect/table.md" >>"$summary"
    fi
  fi
  echo "gate: nightly bisect exit $bisect_rc" >&2
fi

if [ -n "$service" ] && [ "$suites_rc" != 0 ]; then
  # The comparison judges changes against the baseline; a failing test fails the job
  # even when it failed on the baseline too, so the summary says so.
  printf '\n**The suites failed (pytest exit %s)**: the job fails; the Allure report artifact lists the failures.\n' \
    "$suites_rc" >>"$summary"
fi
if [ -f "$out/ab-undecided.md" ]; then cat "$out/ab-undecided.md" >>"$summary"; fi
echo "gate: suites $suites_rc, A/B $ab_rc, report $report_rc, upload $upload_rc, compare $compare_rc" >&2
for rc in "$suites_rc" "$ab_rc" "$compare_rc" "$upload_rc" "$report_rc"; do
  [ "$rc" = 0 ] || exit "$rc"
done
