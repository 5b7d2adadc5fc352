#!/usr/bin/env bash
# One device call: `triton-swa bench` over its whole default grid against every peer reachable on the
# H200 (SGLang's Triton decode and extend from the carried .whl, vLLM's Triton unified attention from
# the carried .peers, gather + SDPA, the copy and read ceilings), in two runs of the same harness:
# decode, then prefill and verify (with FlexAttention). WHAT=flex: FlexAttention's decode rows and the
# GPU suite instead (its compiles take tens of seconds per shape). Logs and the CSV go to $OUT.
#   bash scripts/gpu_bench_all.sh GIT_SHA        (carry .whl and .peers)
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
source "$(dirname "$0")/device_env.sh"
install_carried_wheels .whl/sglang .whl/demo || exit 1
bench() {
  local name=$1 limit=$2
  shift 2
  timeout "$limit" python3 -m triton_swa bench --git-sha "$sha" --dirty clean --out "$out" "$@" > "$out/bench-$name.log" 2> "$out/bench-$name-stderr.log"
  local status=$?
  grep -v "^rows:\|^plot:" "$out/bench-$name.log" | cut -c1-400
  grep -v "^\[" "$out/bench-$name-stderr.log" | tail -3
  echo "== bench $name exit $status"
}
peers=sglang_triton,vllm_triton,vllm_triton_trimmed,copy_same_bytes,read_same_bytes
if [ "${WHAT:-}" = flex ]; then
  bench flex-decode "${FLEX_TIMEOUT_S:-200}" --op decode --pages 1 --batch 1,64 --providers triton_swa,flex,copy_same_bytes
  run_gpu_suite "$sha"
else
  bench decode "${DECODE_TIMEOUT_S:-330}" --op decode --providers "triton_swa,gather_sdpa,$peers"
  bench extend "${EXTEND_TIMEOUT_S:-200}" --op prefill,verify --providers "triton_swa,flex,$peers"
fi
