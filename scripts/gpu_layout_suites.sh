#!/usr/bin/env bash
# The GPU suite before and after a change, in one device call (issue 14: behaviour unchanged). The
# "after" tree is this repo root, "before" is .ab/before (git archive <old-sha> | tar -x -C .ab/before,
# carried to the device with .whl, the wheels of scripts/carry_sglang_wheels.sh and .whl/demo).
# Each tree runs with its own packages first on PYTHONPATH (the old tree's reference/ linked as
# triton_swa_reference); the soak test is left out of both. Logs go to $OUT.
#   bash scripts/gpu_layout_suites.sh GIT_SHA
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
[ -f .ab/before/triton_swa/__init__.py ] || { echo "no .ab/before tree"; exit 2; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
install_carried_wheels .whl/sglang .whl/demo || exit 1
engines=/tmp/site:/tmp/triton_swa_meta
old_site=/tmp/before_site
mkdir -p "$old_site" && ln -sfn "$PWD/.ab/before/reference" "$old_site/triton_swa_reference"

run_suite() {  # run_suite NAME TREE PYTHONPATH
  local t0=$SECONDS
  echo "git_sha $sha tree $1" > "$out/gpu-tests-$1.log"
  (cd "$2" && PYTHONPATH="$3" timeout "${TESTS_TIMEOUT_S:-270}" python3 -m pytest tests -q -p no:cacheprovider -n 14 \
    --deselect tests/test_soak.py -rf >> "$out/gpu-tests-$1.log" 2>&1)
  local status=$?
  echo "== $1: $(tail -1 "$out/gpu-tests-$1.log") ($(( SECONDS - t0 )) s, exit $status)"
  grep -E "^FAILED|^ERROR" "$out/gpu-tests-$1.log" | head -20
}
run_suite after "$PWD" "$PWD:$engines"
run_suite before "$PWD/.ab/before" "$PWD/.ab/before:$old_site:$engines"
