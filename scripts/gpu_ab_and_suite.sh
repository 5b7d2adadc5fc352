#!/usr/bin/env bash
# One device call: the before/after benchmark of the public API (scripts/gpu_ab.sh, .ab/before against
# this tree), then this tree's GPU suite with -n 14 (the SGLang and transformers tiers on cuda, from the
# carried .whl). Logs go to $OUT.
#   bash scripts/gpu_ab_and_suite.sh GIT_SHA
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
bash "$(dirname "$0")/gpu_ab.sh" "$sha" --budget-s 300 | tail -40
source "$(dirname "$0")/device_env.sh"
install_carried_wheels .whl/sglang .whl/demo || exit 1
TESTS_TIMEOUT_S=${TESTS_TIMEOUT_S:-250} run_gpu_suite "$sha"
