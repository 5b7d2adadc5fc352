#!/usr/bin/env bash
# One device call: triton-swa bench's decode grid at page size 16 against vLLM's Triton unified attention
# (its block table as its backend builds it, and trimmed to the window), with the same-bytes copy.
# Needs .peers carried (bash scripts/fetch_peers.sh here first). Logs and the CSV go to $OUT.
#   bash scripts/gpu_peers.sh GIT_SHA
set -uo pipefail
sha=${1:?pass the git sha of this tree (the device copy has no .git)}
source "$(dirname "$0")/device_env.sh"
timeout "${BENCH_TIMEOUT_S:-200}" python3 -m triton_swa bench --git-sha "$sha" --dirty clean --out "$out" --op decode --pages 16 \
  --providers triton_swa,vllm_triton,vllm_triton_trimmed,copy_same_bytes > "$out/bench-vllm.log" 2> "$out/bench-vllm-stderr.log"
status=$?
grep -v "^rows:\|^plot:" "$out/bench-vllm.log" | cut -c1-300
grep -v "^\[" "$out/bench-vllm-stderr.log" | tail -5
echo "== bench exit $status"
exit $status
