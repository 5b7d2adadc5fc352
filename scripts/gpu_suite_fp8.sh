#!/usr/bin/env bash
# One device call: this tree's GPU suite with -n 14 (the SGLang and transformers tiers on cuda, from the
# carried .whl), then the fp8 decode benchmark with its tile sweep (bench/bench_fp8.py). Logs and CSVs
# go to $OUT.
#   bash scripts/gpu_suite_fp8.sh GIT_SHA
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
source "$(dirname "$0")/device_env.sh"
install_carried_wheels .whl/sglang .whl/demo || exit 1
run_gpu_suite "$sha"
tests=$?
FP8_TIMEOUT_S=${FP8_TIMEOUT_S:-200} run_bench_fp8 "$sha" --sweep
bench=$?
exit $((tests || bench))
