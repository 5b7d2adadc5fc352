#!/usr/bin/env bash
# One device call: the before/after benchmark of the public API (scripts/gpu_ab.sh, .ab/before against
# this tree, carried), then the fp8 decode benchmark (bench/bench_fp8.py: bf16 against fp8 read natively
# and as bytes decoded in the kernel, e4m3fnuz, with its tile sweep). Logs and CSVs go to $OUT.
#   bash scripts/gpu_fp8.sh GIT_SHA [bench/bench_fp8.py args]
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
shift
bash "$(dirname "$0")/gpu_ab.sh" "$sha" --budget-s "${AB_BUDGET_S:-240}" | tail -42
source "$(dirname "$0")/device_env.sh"
run_bench_fp8 "$sha" --sweep "$@"
